"""The one exception type users see.

Anything raised as `UserError` is a problem with the user's input (a file, a key, a value), not
a bug: the CLI prints its message as one line and exits non-zero, without a traceback.
"""


class UserError(Exception):
    """Bad input: the message names the file, key or value at fault."""
