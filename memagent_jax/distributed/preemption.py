"""A stop (SIGTERM, Ctrl-C) that every process of a job takes at the same agreed point
(`PreemptionNotice`). At import only the standard library and `startup`: the command modules
import it."""

from __future__ import annotations

import os
import threading

from memagent_jax.distributed.startup import joined


class PreemptionNotice:
    """Whether the job has been told to stop: SIGTERM (how TPU VMs and most schedulers announce
    a preemption) or SIGINT (Ctrl-C). While it listens (`with notice:`), either signal sets a
    flag on the process that gets it, and SIGINT also writes `on_interrupt` to that process's
    stderr: the stop comes at the next agreed point, not at once, and a person should know. A
    later signal changes nothing, so that a second Ctrl-C cannot cut short what the first one
    started (a checkpoint being written). `reached()` is called by every process at the same
    points (after each turn and each step) and returns True on all of them at the same call
    once any of them got a signal (an all-gather of the flags); from then on `interrupted`
    says, the same on every process, whether the job stops for a Ctrl-C (any process got
    SIGINT) or a preemption.

    JAX's own preemption sync point is switched off (`startup.start`): Orbax's
    CheckpointManager asks it on every save with its own step numbers, so a second caller
    counting its own calls could miss the point the processes agreed on."""

    _NONE, _SIGTERM, _SIGINT = 0, 1, 2  # a process's flag; the job takes the highest

    def __init__(self, on_interrupt: str = ""):
        self.on_interrupt = on_interrupt
        self.interrupted = False
        self._flag = self._NONE
        self._agreed = self._NONE
        self._previous: dict = {}

    def __enter__(self) -> PreemptionNotice:
        import signal
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._on_signal)
                              for s in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc) -> None:
        import signal
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _on_signal(self, signum, frame) -> None:
        import signal
        interrupt = signum == signal.SIGINT
        self._flag = max(self._flag, self._SIGINT if interrupt else self._SIGTERM)
        if interrupt and self.on_interrupt:
            # os.write, not print: the handler may run in the middle of another write to
            # sys.stderr (the progress bar's), which print would then refuse as reentrant.
            os.write(2, f"\n{self.on_interrupt}\n".encode())

    @property
    def signal_number(self) -> int:
        """The signal the job stops for, once `reached()`: SIGINT where `interrupted`, else
        SIGTERM (`errors.Interrupted`'s exit status is 128 + it)."""
        import signal
        return signal.SIGINT if self.interrupted else signal.SIGTERM

    def reached(self) -> bool:
        if not self._agreed:
            flag = self._flag
            if joined():
                import numpy as np
                from jax.experimental import multihost_utils
                flag = int(multihost_utils.process_allgather(np.array([flag])).max())
            self._agreed = flag
            self.interrupted = flag == self._SIGINT
        return bool(self._agreed)
