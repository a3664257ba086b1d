"""`python -m posleak`: the same as the `posleak` command."""

import sys

from posleak.cli import main

sys.exit(main())
