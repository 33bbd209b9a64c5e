"""The exception types users see.

Anything raised as `UserError` is a problem with the user's input (a file, a key, a value), not
a bug: the CLI prints its message as one line and exits non-zero, without a traceback.
`ConfigError` is what a config section's own check raises: it names the key as the YAML configs
spell it (`learner.lr`), and a command that fills the section from flags names the flag instead.
`Interrupted` is Ctrl-C where long work runs: one line saying what was kept, exit status 130.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input: the message names the file, key or value at fault."""


class Interrupted(Exception):
    """Ctrl-C, caught where the work is: the message says what was kept and how to go on."""


class ConfigError(UserError):
    """A bad value in a config section: `key` is its dotted config key ("learner.lr"; a
    section's name where the message is about the section as a whole)."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}" if key else message)
        self.key, self.message = key, message
