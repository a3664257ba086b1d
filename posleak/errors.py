"""The one exception type that reaches users as a single line (DESIGN.md §7)."""


class PosleakError(Exception):
    """A problem with the user's input or environment, with the fix in the message.

    The command line prints it as one line on stderr and exits with status 2; anything else that
    escapes is a bug in posleak and keeps its traceback.
    """
