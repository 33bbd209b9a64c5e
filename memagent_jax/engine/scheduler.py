"""Continuous batching over an engine's slots: requests in, completions out.

`Scheduler.run(params)` steps a `DecodeEngine` with the given parameters until every request
has finished; `complete(engine, params, requests)` is the one-call form. Requests wait in
submission order; whenever slots are free the next ones are inserted, their prompts prefilled in
whole calls of the engine's `prefill_rows` (with the prompts waiting next, whose prefixes wait
for their slots), and every engine step advances all busy slots by one token, so short
requests never wait for long ones. A request with n > 1
samples is prefilled once and its prefix inserted into n slots, each sample drawing from its
own key. `on_done` callbacks may submit more requests (the MemAgent loop chains a document's
turns this way).

The engine's outputs are read one step late: step t + 1 is queued before step t's tokens are
copied to the host, so the host's work (appending tokens, finishing requests, the callbacks
that build the next prompts) overlaps the device's instead of idling it every step. A slot is
freed the step its request is asked for its last token when that is its token limit (or the
engine's max_len), known in advance; a request that stops at a stop id is seen one step late,
and its slot computes one more token, discarded.

A server keeps one scheduler running for requests that arrive while it steps: `run(params,
poll)` calls `poll()` before every step, where it may `submit` new requests or `cancel` ones
whose client has gone (their slots are free for the next step); `submit(..., on_token)` sees
each token as it is read, for streaming.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import secrets
from collections.abc import Callable
from typing import cast

import jax
import numpy as np

from memagent_jax.engine.engine_api import DecodeEngine, PromptTooLong, StepLogprobs
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class Request:
    """n samples of a prompt; sample j draws from the key of sample `first_index + j` of
    `sampling.seed` (`sampling.request_key`), so one request of n samples and n requests of
    one sample each (first_index 0, 1, ...) draw the same tokens."""
    prompt_ids: tuple[int, ...]
    max_new_tokens: int = 256
    sampling: SamplingParams = SamplingParams()
    stop_ids: tuple[int, ...] = ()
    n: int = 1
    first_index: int = 0


# A token's top alternatives: (ids, log-probabilities), most likely first.
TopLogprobs = tuple[tuple[int, ...], tuple[float, ...]]


@dataclasses.dataclass
class Completion:
    """token_ids include the stop token when finish_reason is "stop"; logprobs[i] is
    token_ids[i]'s log-probability at the request's temperature; top_logprobs[i] its step's
    most likely tokens, when the request asks (`SamplingParams.top_logprobs`) of an engine that
    computes them (`EngineConfig.top_logprobs`)."""
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str = ""  # "stop" | "length"; "abort" once cancelled
    top_logprobs: list[TopLogprobs] = dataclasses.field(default_factory=list)


# on_token(sample index, token, its logprob, its step's top tokens or None)
OnToken = Callable[[int, int, float, "TopLogprobs | None"], None]


@dataclasses.dataclass
class _Active:
    """One sample of a request in a slot. limit: the most tokens it may generate (its
    max_new_tokens, or what max_len leaves); asked: tokens requested of the engine so far,
    some maybe not read yet."""
    request_id: int
    sample_index: int
    slot: int
    limit: int
    completion: Completion = dataclasses.field(default_factory=lambda: Completion([], []))
    asked: int = 0


# Engine outputs not read yet: (the samples they belong to, each with its index into the
# output, tokens, logprobs), device arrays; an insert's outputs are scalars (index 0).
_Unread = tuple[list[tuple[int, _Active]], object, object]


class Scheduler:
    """Feeds requests through a DecodeEngine; see the module docstring."""

    def __init__(self, engine: DecodeEngine):
        self.engine = engine
        self.state = engine.init_decode_state()
        self.requests: dict[int, Request] = {}
        self.results: dict[int, list[Completion | None]] = {}
        self._callbacks: dict[int, Callable[[list[Completion]], None]] = {}
        self._token_callbacks: dict[int, OnToken] = {}
        self._waiting: collections.deque[tuple[int, int]] = collections.deque()
        self._prefixes: dict[int, tuple[object, int]] = {}  # request -> (prefix, inserts left)
        self._slots: list[_Active | None] = [None] * engine.config.slots
        self._unread: collections.deque[_Unread] = collections.deque()
        self._next_id = 0

    @property
    def busy_slots(self) -> int:
        """Slots holding a sample now."""
        return sum(active is not None for active in self._slots)

    def check(self, request: Request) -> None:
        """Raises UserError if the engine cannot serve the request."""
        limit = self.engine.max_len
        if not request.prompt_ids:
            raise UserError("empty prompt")
        vocab = self.engine.vocab_size
        if min(request.prompt_ids) < 0 or max(request.prompt_ids) >= vocab:
            outside = next(t for t in request.prompt_ids if not 0 <= t < vocab)
            raise UserError(f"token id {outside} is outside the model's vocabulary of {vocab} "
                            "ids")
        if len(request.prompt_ids) >= limit:
            raise PromptTooLong(f"prompt of {len(request.prompt_ids)} tokens does not fit the "
                            f"engine's maximum length of {limit} tokens (prompt + reply)")
        if request.max_new_tokens <= 0:
            raise UserError(f"max_new_tokens must be positive, got {request.max_new_tokens}")
        if request.n < 1:
            raise UserError(f"n must be at least 1, got {request.n}")
        if request.first_index < 0:
            raise UserError(f"first_index must be >= 0, got {request.first_index}")

    def submit(self, request: Request,
               on_done: Callable[[list[Completion]], None] | None = None,
               on_token: OnToken | None = None) -> int:
        """Queues a request; returns its id. on_done(completions) runs when all n finish;
        on_token(sample index, token, logprob, top) for each token as it is read (before the
        on_done its last token may trigger)."""
        self.check(request)
        if request.sampling.seed is None:
            request = dataclasses.replace(request, sampling=dataclasses.replace(
                request.sampling, seed=secrets.randbits(31)))
        request_id = self._next_id
        self._next_id += 1
        self.requests[request_id] = request
        self.results[request_id] = [None] * request.n
        if on_done is not None:
            self._callbacks[request_id] = on_done
        if on_token is not None:
            self._token_callbacks[request_id] = on_token
        self._waiting.extend((request_id, j) for j in range(request.n))
        return request_id

    def cancel(self, request_id: int) -> None:
        """Drops a request that has not finished: its samples leave the queue and their slots,
        free for the next step; its tokens not read yet are discarded; its callbacks are not
        called again. Unknown or finished ids are ignored."""
        if self.requests.pop(request_id, None) is None:
            return
        del self.results[request_id]
        self._callbacks.pop(request_id, None)
        self._token_callbacks.pop(request_id, None)
        self._prefixes.pop(request_id, None)
        self._waiting = collections.deque(w for w in self._waiting if w[0] != request_id)
        for slot, active in enumerate(self._slots):
            if active is not None and active.request_id == request_id:
                active.completion.finish_reason = "abort"
                self._slots[slot] = None

    def clear(self) -> None:
        """Drops every request, waiting, running or with outputs not read (a run abandoned
        half way leaves nothing behind for the next)."""
        for request_id in list(self.requests):
            self.cancel(request_id)
        self._unread.clear()

    def run(self, params, poll: Callable[[], None] | None = None) -> None:
        """Steps the engine with `params` until every submitted request (and any its callbacks
        submit) has finished. poll(), if given, runs before every step (and once more before
        returning); it may submit and cancel requests."""
        placed = self.engine.place(params)
        while True:
            if poll is not None:
                poll()
            if not self.step(placed):
                break

    @property
    def idle(self) -> bool:
        """No request waits, runs or has outputs not read yet."""
        return not (self._waiting or any(self._slots) or self._unread)

    def step(self, placed) -> bool:
        """One round with parameters as `engine.place` gives them: free slots filled, one
        engine step queued for the busy slots, the outputs before it read (callbacks run).
        False, doing nothing, when `idle`."""
        if self.idle:
            return False
        self._fill_free_slots(placed)
        busy = [(slot, active) for slot, active in enumerate(self._slots) if active]
        if busy:
            # Entries each busy slot reads: its prompt and the tokens fed so far.
            lengths = [len(self.requests[a.request_id].prompt_ids) + a.asked for _, a in busy]
            self.state, tokens, logprobs = self.engine.generate(
                placed, self.state, max(lengths), sum(lengths))
            self._unread.append((busy, tokens, logprobs))
            for _, active in busy:
                self._asked(active)
        # Everything but the step just queued, which runs while these are read.
        while len(self._unread) > (1 if busy else 0):
            self._read(self._unread.popleft())
        return True

    def _fill_free_slots(self, params) -> None:
        rows = self.engine.config.prefill_rows
        while self._waiting and None in self._slots:
            free = [slot for slot, active in enumerate(self._slots) if active is None]
            count = min(len(free), len(self._waiting))
            needed = {r for r, _ in itertools.islice(self._waiting, count)
                      if r not in self._prefixes}
            if needed:
                # Whole calls: a call's rows run side by side over the mesh, so it costs about
                # what one row costs. The prompts these slots need come first, then the next
                # waiting ones up to a multiple of prefill_rows, whose prefixes wait for slots.
                queued = [r for r in dict.fromkeys(r for r, _ in self._waiting)
                          if r not in self._prefixes]
                self._prefill_new(params, queued[:-(-len(needed) // rows) * rows])
            starting = [self._waiting.popleft() for _ in range(count)]
            for slot, (request_id, sample_index) in zip(free, starting):
                request = self.requests[request_id]
                self.state, token, logprob = self.engine.insert(
                    self._take_prefix(request_id), self.state, slot, request.sampling,
                    request.first_index + sample_index)
                limit = min(request.max_new_tokens,
                            self.engine.max_len - len(request.prompt_ids))
                active = _Active(request_id, sample_index, slot, limit)
                self._slots[slot] = active
                self._unread.append(([(0, active)], token, logprob))
                # A limit of one token frees the slot again for this loop's next round.
                self._asked(active)

    def _prefill_new(self, params, request_ids) -> None:
        """Prefills, prefill_rows prompts per engine call, the requests not prefilled yet (each
        once, however many of its samples start now)."""
        new = [r for r in dict.fromkeys(request_ids) if r not in self._prefixes]
        rows = self.engine.config.prefill_rows
        for start in range(0, len(new), rows):
            group = new[start:start + rows]
            prefixes = self.engine.prefill(params, [self.requests[r].prompt_ids for r in group])
            for request_id, prefix in zip(group, prefixes):
                self._prefixes[request_id] = (prefix, self.requests[request_id].n)

    def _take_prefix(self, request_id: int):
        """The request's prefix, dropped after its last sample's insert."""
        prefix, left = self._prefixes[request_id]
        if left > 1:
            self._prefixes[request_id] = (prefix, left - 1)
        else:
            del self._prefixes[request_id]
        return prefix

    def _asked(self, active: _Active) -> None:
        """Counts a token requested for `active`; at its limit the slot is free for the next
        request already (that token is read later)."""
        active.asked += 1
        if active.asked == active.limit and self._slots[active.slot] is active:
            self._slots[active.slot] = None

    def _read(self, unread: _Unread) -> None:
        samples, tokens, logprobs = unread
        tokens, logprobs = jax.device_get((tokens, logprobs))
        top_ids: np.ndarray | None = None
        top: np.ndarray | None = None
        if isinstance(logprobs, StepLogprobs):
            k = np.shape(logprobs.top)[-1]
            top_ids, top = np.reshape(logprobs.top_ids, (-1, k)), np.reshape(logprobs.top, (-1, k))
            logprobs = logprobs.chosen
        tokens, logprobs = np.reshape(tokens, -1), np.reshape(logprobs, -1)
        for index, active in samples:
            # A token past its stop, or of a cancelled request: discarded.
            if active.completion.finish_reason or active.request_id not in self.requests:
                continue
            alternatives = None
            if top_ids is not None and top is not None and (
                    self.requests[active.request_id].sampling.top_logprobs):
                alternatives = (tuple(top_ids[index].tolist()), tuple(top[index].tolist()))
            self._append(active, int(tokens[index]), float(logprobs[index]), alternatives)

    def _append(self, active: _Active, token: int, logprob: float,
                top: TopLogprobs | None) -> None:
        request = self.requests[active.request_id]
        completion = active.completion
        completion.token_ids.append(token)
        completion.logprobs.append(logprob)
        if top is not None:
            completion.top_logprobs.append(top)
        on_token = self._token_callbacks.get(active.request_id)
        if on_token is not None:
            on_token(active.sample_index, token, logprob, top)
        if token in request.stop_ids:
            completion.finish_reason = "stop"
        elif len(completion.token_ids) >= active.limit:
            completion.finish_reason = "length"
        else:
            return
        if self._slots[active.slot] is active:
            self._slots[active.slot] = None
        request_id = active.request_id
        results = self.results[request_id]
        results[active.sample_index] = completion
        if all(r is not None for r in results):
            # Finished requests are dropped (long runs submit many thousands); results stay
            # for callers without a callback, who read them from `results`.
            del self.requests[request_id]
            self._token_callbacks.pop(request_id, None)
            callback = self._callbacks.pop(request_id, None)
            if callback is not None:
                del self.results[request_id]
                callback(cast("list[Completion]", results))  # each filled (checked above)


def complete(engine: DecodeEngine, params, requests: list[Request],
             on_done: Callable[[int, list[Completion]], None] | None = None,
             poll: Callable[[], None] | None = None) -> list[list[Completion]]:
    """Runs requests to completion with `params`; returns each request's n completions, in
    input order. on_done(index, completions) is called as each request finishes (for progress
    bars); poll() before every engine step (`Scheduler.run`: a command's check for a stop,
    which raises)."""
    scheduler = Scheduler(engine)
    for request in requests:
        scheduler.check(request)
    results: list[list[Completion]] = [[] for _ in requests]

    def finish(index: int, completions: list[Completion]) -> None:
        results[index] = completions
        if on_done is not None:
            on_done(index, completions)

    for i, request in enumerate(requests):
        scheduler.submit(request, functools.partial(finish, i))
    scheduler.run(params, poll)
    return results
