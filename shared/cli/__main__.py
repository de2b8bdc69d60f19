"""``python -m shared.cli``: the ``ferry`` command (the Jobs and the tests run it so)."""

import sys

from shared.cli.main import main

sys.exit(main())
