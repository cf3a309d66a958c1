"""The sessions package without the ``postgres`` extra: its PostgreSQL names are
imported lazily, so everything else works, and nothing that walks the package (``dir``,
``inspect.getmembers``, ``pydoc``) trips over the names it cannot import."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import trio_agents.sessions

WITHOUT_PSYCOPG = textwrap.dedent(
    """
    import inspect, pydoc, sys
    sys.modules["psycopg"] = None  # as if the extra were not installed
    sys.modules["psycopg_pool"] = None
    import trio_agents.sessions as sessions

    assert "PostgresSession" not in dir(sessions)
    assert "SQLiteSession" in dir(sessions)
    names = dict(inspect.getmembers(sessions))
    assert "MemorySession" in names and "PostgresSession" not in names
    pydoc.render_doc(sessions)
    try:
        sessions.PostgresSession
    except ImportError as exc:
        assert "pip install 'trio-agents[postgres]'" in str(exc), exc
    else:
        raise AssertionError("PostgresSession imported without psycopg")
    print("ok")
    """
)


def test_without_the_extra_the_package_walks_and_names_the_missing_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PSYCOPG], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr


def test_with_the_extra_dir_lists_the_lazy_names() -> None:
    listed = dir(trio_agents.sessions)
    assert {"PostgresSession", "PostgresSessionStatistics"} <= set(listed)
    assert listed == sorted(listed)
