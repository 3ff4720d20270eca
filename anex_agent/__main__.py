"""``python -m anex_agent`` is the same as the ``anex-agent`` command."""

import sys

from anex_agent.cli import main

sys.exit(main())
