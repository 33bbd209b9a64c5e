"""The exception types users see.

Anything raised as `UserError` is a problem with the user's input (a file, a key, a value), not
a bug: the CLI prints its message as one line and exits non-zero, without a traceback.
`ConfigError` is what a config section's own check raises: it names the key as the YAML configs
spell it (`learner.lr`), and a command that fills the section from flags names the flag instead.
`Interrupted` is Ctrl-C or SIGTERM where long work runs: one line saying what was kept, exit
status 128 + the signal's number (130, 143), as a shell reports a process the signal ended.
"""

from __future__ import annotations

import signal


class UserError(Exception):
    """Bad input: the message names the file, key or value at fault."""


class Interrupted(Exception):
    """Ctrl-C (SIGINT) or SIGTERM, caught where the work is: the message says what was kept
    and how to go on; `status` is the exit status, 128 + `signal_number`: 130 for Ctrl-C, 143
    for SIGTERM (a scheduler's preemption notice), so that a job stopped before its end never
    exits 0, the status of one that finished (docs/guides/pods.md)."""

    def __init__(self, message: str, signal_number: int = signal.SIGINT):
        super().__init__(message)
        self.status = 128 + signal_number


class ConfigError(UserError):
    """A bad value in a config section: `key` is its dotted config key ("learner.lr"; a
    section's name where the message is about the section as a whole)."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}" if key else message)
        self.key, self.message = key, message
