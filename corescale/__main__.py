"""`python -m corescale`: the CLI."""

import sys

from corescale.cli import main

sys.exit(main())
