"""``python -m fiomon``: the same entry point as the ``fiomon`` console script."""

import sys

from fiomon.cli import main

sys.exit(main())
