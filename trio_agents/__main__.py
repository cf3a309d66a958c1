"""``python -m trio_agents``: the ``trio-agents`` command (see ``docs/cli.md``)."""

from ._cli import entry

entry()
