"""``python -m conveyor`` is the ``conveyor`` command."""

import sys

from conveyor.cli import main

sys.exit(main())
