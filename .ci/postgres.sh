#!/usr/bin/env bash
# PostgreSQL for the tests (they start a throwaway server of their own: tests/pg_support.py).
# Idempotent and quiet: installs Debian's `postgresql` only when no initdb can be found,
# and only as root; otherwise says what is missing (the tests then skip, or fail under CI).
set -euo pipefail
found() {
    command -v initdb >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}
if found; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "postgres.sh: no PostgreSQL (initdb) found; install the 'postgresql' package" \
        "to run PostgresSession's tests" >&2
    exit 0
fi
echo "postgres.sh: installing PostgreSQL (apt-get install postgresql)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends postgresql >/dev/null
found || { echo "postgres.sh: installed postgresql, still no initdb" >&2; exit 1; }
