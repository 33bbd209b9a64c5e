"""The engine's thread: one `Scheduler` that keeps stepping while requests arrive and leave.

Request handlers run on the HTTP server's event loop; the engine runs here, on its own thread,
so a slow client never stalls a decode step and a long step never stalls the event loop. The
two sides meet in a command queue (submit, cancel, abort, stop) that the thread drains before
every step (`Scheduler.run`'s poll), and in each job's callbacks, which the thread calls with
the job's tokens and completions (the handler's side makes them thread-safe).

Backpressure: at most `max_requests` jobs are in flight (waiting for a slot or decoding);
`submit` beyond that raises `Overloaded` at once (HTTP 429) rather than queueing without bound.
"""

from __future__ import annotations

import dataclasses
import queue
import sys
import threading
import traceback
from collections.abc import Callable

from memagent_jax.engine.engine_api import DecodeEngine
from memagent_jax.engine.scheduler import Completion, OnToken, Request, Scheduler


class Overloaded(Exception):
    """Every place for a request in flight is taken."""


class ShuttingDown(Exception):
    """The worker has stopped taking requests."""


@dataclasses.dataclass(eq=False)
class Job:
    """One request through the worker. The callbacks run on the engine thread, in order:
    on_token for each token as it is read, then exactly one of on_done(completions) (all n
    finished) or on_abort(reason) ("shutdown", or "engine error: ..."); nothing after
    `cancel` has been handled."""
    request: Request
    on_token: OnToken
    on_done: Callable[[list[Completion]], None]
    on_abort: Callable[[str], None]


@dataclasses.dataclass
class Stats:
    """Counters for /metrics. busy_slots_peak: the most slots ever decoding at once (more than
    one means requests were batched)."""
    requests_total: int = 0
    in_flight: int = 0
    busy_slots: int = 0
    busy_slots_peak: int = 0
    decode_steps_total: int = 0
    tokens_total: int = 0


class EngineWorker:
    """Runs `engine` with `params` on a thread of its own (`start`, `stop`); `submit`, `cancel`
    and `abort_all` may be called from any thread."""

    def __init__(self, engine: DecodeEngine, params, max_requests: int):
        self.engine, self.params, self.max_requests = engine, params, max_requests
        self.scheduler = Scheduler(engine)
        self.stats = Stats()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._jobs: dict[Job, int] = {}  # engine thread only: job -> scheduler request id
        self._lock = threading.Lock()   # guards accepting and stats.in_flight
        self._accepting = True
        self._stopping = False          # engine thread only
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def check(self, request: Request) -> None:
        """Raises UserError if the engine cannot take the request (its shape only)."""
        self.scheduler.check(request)

    def submit(self, job: Job) -> None:
        """Queues the job; raises ShuttingDown or Overloaded instead when it cannot."""
        with self._lock:
            if not self._accepting:
                raise ShuttingDown()
            if self.stats.in_flight >= self.max_requests:
                raise Overloaded()
            self.stats.in_flight += 1
            self.stats.requests_total += 1
        self._commands.put(("submit", job))

    def cancel(self, job: Job) -> None:
        """Drops the job (its client has gone, or needs no more tokens); its slots free up at
        the next step. Harmless for a job that has finished."""
        self._commands.put(("cancel", job))

    def abort_all(self, reason: str) -> None:
        """Takes no more jobs (`submit` raises ShuttingDown) and ends every job in flight
        with on_abort(reason); the thread runs on until `stop`."""
        with self._lock:
            self._accepting = False
        self._commands.put(("abort", reason))

    def stop(self, timeout: float) -> bool:
        """Stops taking jobs, aborts those in flight ("shutdown") and ends the thread once the
        current step is done; returns whether it ended within `timeout` seconds."""
        with self._lock:
            self._accepting = False
        self._commands.put(("stop", None))
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    # ---- the engine thread --------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping:
            self._apply(*self._commands.get())  # idle: wait for work
            try:
                self.scheduler.run(self.params, poll=self._poll)
            except Exception as e:  # a bug or a device failure: fail the jobs, keep serving
                traceback.print_exc(file=sys.stderr)
                self._abort_jobs(f"engine error: {type(e).__name__}: {e}")
                self.scheduler = Scheduler(self.engine)  # its decode state may be gone

    def _poll(self) -> None:
        """Before every step: take the commands that arrived, count the batch."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            self._apply(*command)
        busy = self.scheduler.busy_slots
        self.stats.busy_slots = busy
        self.stats.busy_slots_peak = max(self.stats.busy_slots_peak, busy)
        self.stats.decode_steps_total += busy > 0

    def _apply(self, kind: str, value) -> None:
        """Carries out one command."""
        if kind == "submit":
            job: Job = value
            self._jobs[job] = self.scheduler.submit(
                job.request, on_done=lambda completions: self._done(job, completions),
                on_token=lambda *token: self._token(job, token))
        elif kind == "cancel":
            request_id = self._jobs.pop(value, None)
            if request_id is not None:
                self.scheduler.cancel(request_id)
                self._release()
        elif kind == "abort":
            self._abort_jobs(value)
        elif kind == "stop":
            self._abort_jobs("shutdown")
            self._stopping = True

    def _token(self, job: Job, token: tuple) -> None:
        self.stats.tokens_total += 1
        job.on_token(*token)

    def _done(self, job: Job, completions: list[Completion]) -> None:
        if self._jobs.pop(job, None) is not None:
            self._release()
            job.on_done(completions)

    def _abort_jobs(self, reason: str) -> None:
        for job, request_id in list(self._jobs.items()):
            self.scheduler.cancel(request_id)
            del self._jobs[job]
            self._release()
            job.on_abort(reason)

    def _release(self) -> None:
        with self._lock:
            self.stats.in_flight -= 1
