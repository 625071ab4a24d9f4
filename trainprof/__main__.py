"""`python -m trainprof ...` runs the command line."""

import sys

from trainprof.cli import main

sys.exit(main())
