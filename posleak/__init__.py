"""posleak: where does the absolute-position information in a decoder's attention come from?

The package is built in floors, each importing only its own and those below it (the layout table of
docs/architecture.md, which tests/test_layout.py reads, is the one place the order is written), bottom floor first:
base → store → runner → report → data → capture → models → measure → intervene → pipeline → commands → lab →
experiments → cli.
"""

from posleak.errors import PosleakError

__version__ = "0.1.0"
__all__ = ["PosleakError", "__version__"]
