"""``python -m conveyor`` is the ``conveyor`` command."""

import sys

from conveyor.tools.cli import main

sys.exit(main())
