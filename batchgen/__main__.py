"""`python -m batchgen` runs the `batchgen` command."""

import sys

from batchgen.cli import main

sys.exit(main())
