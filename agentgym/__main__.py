"""``python -m agentgym``: the ``agentgym`` command (``main`` of ``app/cli.py``)."""

import sys

from .app.cli import main

sys.exit(main())
