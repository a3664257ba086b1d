"""posleak: where does the absolute-position information in a decoder's attention come from?

The package follows the data flow of an analysis:
models → data → capture → measure → intervene → lab → report → cli.
"""

from posleak.errors import PosleakError

__version__ = "0.1.0"
__all__ = ["PosleakError", "__version__"]
