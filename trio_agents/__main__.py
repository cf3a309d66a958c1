"""``python -m trio_agents``: the ``trio-agents`` command (see ``docs/cli.md``)."""

import sys

from ._cli import main

sys.exit(main())
