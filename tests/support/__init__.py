"""What the tests share: loopback wire servers, PostgreSQL and cluster processes, helpers."""
