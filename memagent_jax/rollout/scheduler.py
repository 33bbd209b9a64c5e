"""Continuous batching over the engine's slots: requests in, completions out.

Requests wait in submission order; whenever slots are free the next ones are prefilled (up to
the engine's `prefill_rows` prompts per call) and inserted, and every engine step advances all
busy slots by one token. A slot is freed the step its request stops (a stop id, its token
limit, or the engine's max_len), so short requests never wait for long ones. A request with
n > 1 samples is prefilled once and its prefix inserted into n slots, each sample drawing from
its own key. `on_done` callbacks may submit more requests (the MemAgent loop chains a
document's turns this way).
"""

from __future__ import annotations

import collections
import dataclasses
import secrets
from typing import Callable

import jax
import numpy as np

from memagent_jax.errors import UserError
from memagent_jax.rollout.engine import Engine
from memagent_jax.rollout.sampling import SamplingParams


@dataclasses.dataclass(frozen=True)
class Request:
    prompt_ids: tuple[int, ...]
    max_new_tokens: int = 256
    sampling: SamplingParams = SamplingParams()
    stop_ids: tuple[int, ...] = ()
    n: int = 1


@dataclasses.dataclass
class Completion:
    """token_ids include the stop token when finish_reason is "stop"; logprobs[i] is
    token_ids[i]'s log-probability at the request's temperature."""
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str = ""  # "stop" | "length"


@dataclasses.dataclass
class _Active:
    request_id: int
    sample_index: int
    completion: Completion


class Scheduler:
    """Feeds requests through an Engine; see the module docstring."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.state = engine.init_decode_state()
        self.requests: dict[int, Request] = {}
        self.results: dict[int, list[Completion | None]] = {}
        self._callbacks: dict[int, Callable[[list[Completion]], None]] = {}
        self._waiting: collections.deque[tuple[int, int]] = collections.deque()
        self._prefixes: dict[int, tuple[object, int]] = {}  # request -> (prefix, inserts left)
        self._slots: list[_Active | None] = [None] * engine.config.slots
        self._next_id = 0

    def check(self, request: Request) -> None:
        """Raises UserError if the engine cannot serve the request."""
        limit = self.engine.config.max_len
        if not request.prompt_ids:
            raise UserError("empty prompt")
        if len(request.prompt_ids) >= limit:
            raise UserError(f"prompt of {len(request.prompt_ids)} tokens does not fit the "
                            f"engine's maximum length of {limit} tokens (prompt + reply)")
        if request.max_new_tokens <= 0:
            raise UserError(f"max_new_tokens must be positive, got {request.max_new_tokens}")
        if request.n < 1:
            raise UserError(f"n must be at least 1, got {request.n}")

    def submit(self, request: Request,
               on_done: Callable[[list[Completion]], None] | None = None) -> int:
        """Queues a request; returns its id. on_done(completions) runs when all n finish."""
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
        self._waiting.extend((request_id, j) for j in range(request.n))
        return request_id

    def run(self) -> None:
        """Steps until every submitted request (and any its callbacks submit) has finished."""
        while self._waiting or any(self._slots):
            self._fill_free_slots()
            if any(self._slots):
                self.state, tokens, logprobs = self.engine.generate(self.state)
                tokens, logprobs = jax.device_get((tokens, logprobs))
                for slot, active in enumerate(self._slots):
                    if active is not None:
                        self._append(slot, int(tokens[slot]), float(logprobs[slot]))

    def _fill_free_slots(self) -> None:
        while self._waiting and None in self._slots:
            free = [slot for slot, active in enumerate(self._slots) if active is None]
            starting = [self._waiting.popleft() for _ in range(min(len(free), len(self._waiting)))]
            self._prefill_new(request_id for request_id, _ in starting)
            for slot, (request_id, sample_index) in zip(free, starting):
                request = self.requests[request_id]
                self.state, token, logprob = self.engine.insert(
                    self._take_prefix(request_id), self.state, slot, request.sampling,
                    sample_index)
                self._slots[slot] = _Active(request_id, sample_index, Completion([], []))
                # A first token may already finish it (a stop id, or max_new_tokens 1): the
                # slot is then free again for the next round of this loop.
                self._append(slot, int(token), float(logprob))

    def _prefill_new(self, request_ids) -> None:
        """Prefills, prefill_rows prompts per engine call, the requests not prefilled yet (each
        once, however many of its samples start now)."""
        new = [r for r in dict.fromkeys(request_ids) if r not in self._prefixes]
        rows = self.engine.config.prefill_rows
        for start in range(0, len(new), rows):
            group = new[start:start + rows]
            prefixes = self.engine.prefill_batch(
                [np.asarray(self.requests[r].prompt_ids, np.int32) for r in group])
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

    def _append(self, slot: int, token: int, logprob: float) -> None:
        active = self._slots[slot]
        request = self.requests[active.request_id]
        completion = active.completion
        completion.token_ids.append(token)
        completion.logprobs.append(logprob)
        if token in request.stop_ids:
            completion.finish_reason = "stop"
        elif (len(completion.token_ids) >= request.max_new_tokens
              or len(request.prompt_ids) + len(completion.token_ids) >= self.engine.config.max_len):
            completion.finish_reason = "length"
        else:
            return
        self._slots[slot] = None
        request_id = active.request_id
        results = self.results[request_id]
        results[active.sample_index] = completion
        if all(r is not None for r in results):
            # Finished requests are dropped (long runs submit many thousands); results stay
            # for callers without a callback, who read them from `results`.
            del self.requests[request_id]
            callback = self._callbacks.pop(request_id, None)
            if callback is not None:
                del self.results[request_id]
                callback(results)


def generate(engine: Engine, requests: list[Request],
             on_done: Callable[[int, list[Completion]], None] | None = None
             ) -> list[list[Completion]]:
    """Runs requests to completion; returns each request's n completions, in input order.
    on_done(index, completions) is called as each request finishes (for progress bars)."""
    scheduler = Scheduler(engine)
    for request in requests:
        scheduler.check(request)
    results: list[list[Completion]] = [[] for _ in requests]

    def finish(index: int, completions: list[Completion]) -> None:
        results[index] = completions
        if on_done is not None:
            on_done(index, completions)

    for i, request in enumerate(requests):
        scheduler.submit(request, lambda c, i=i: finish(i, c))
    scheduler.run()
    return results
