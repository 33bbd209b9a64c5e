"""Prompts to token ids off the event loop, where a large prompt is never in a small one's way.

A fast tokenizer releases the GIL while it encodes, so tokenizing on a thread keeps the event
loop (and every stream it writes) running; but a thread takes prompts in turn, and a 4 MB prompt
(seconds) would hold every prompt queued behind it. So there are two lanes, each a thread with
a tokenizer of its own (a tokenizer is not used from two threads at once: transformers may
reset its truncation on a call): prompts of up to SMALL_PROMPT_CHARS characters, milliseconds
each, on one; longer ones on the other. A small prompt waits only behind small ones. The
threads are daemons: the process does not wait for a prompt nobody will be answered for to
finish tokenizing before it exits (a ThreadPoolExecutor's thread it would).

A prompt of more characters than any prompt that fits could have is refused before it is
tokenized (400 `context_length_exceeded`): more than `max_chars` besides whitespace, which is
max_len tokens of the tokenizer's longest token (in the characters its vocabulary spells it
with, one per byte for a byte-level one), CHARS_MARGIN times over for normalizations that merge
characters. Whitespace is not counted: a word tokenizer reads runs of it as nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import queue
import threading
from collections.abc import Callable
from typing import TypeVar

from memagent_jax.serve.protocol import bad

SMALL_PROMPT_CHARS = 1 << 16
CHARS_MARGIN = 4

T = TypeVar("T")


class Encoder:
    """The two lanes for `tokenizer`, and the bound for prompts of at most max_len tokens."""

    def __init__(self, tokenizer, max_len: int):
        self.max_len = max_len
        self.longest = max(map(len, tokenizer.get_vocab()))
        self.max_chars = max_len * self.longest * CHARS_MARGIN
        self._lanes = [_Lane(f"tokenizer-{size}", copy.deepcopy(tokenizer))
                       for size in ("small", "large")]

    async def run(self, fn: Callable[[object], T], texts: list[str], where: str) -> T:
        """fn(tokenizer) on the lane for texts' length (what fn tokenizes), once they are
        within the bound (else an APIError 400 naming `where`, the request's field)."""
        chars = sum(map(len, texts))

        def checked(tokenizer) -> T:
            if chars > self.max_chars:  # only then count: a pass over the text
                self._check_length(texts, where)
            return fn(tokenizer)

        return await self._lanes[chars > SMALL_PROMPT_CHARS].run(checked)

    def _check_length(self, texts: list[str], where: str) -> None:
        visible = sum(len(word) for text in texts for word in text.split())
        if visible > self.max_chars:
            has = "have" if where == "messages" else "has"
            raise bad(f"This model's maximum context length is {self.max_len} tokens. However, "
                      f"your {where} {has} {visible} characters besides whitespace, more than "
                      f"{self.max_len} tokens hold (at most {self.max_chars}: {CHARS_MARGIN} x "
                      f"{self.max_len} x {self.longest}, the tokenizer's longest token). Please "
                      f"reduce the length of the {where}.", where, "context_length_exceeded")

    def close(self) -> None:
        """Ends the threads once they finish their current prompt; the rest are dropped."""
        for lane in self._lanes:
            lane.close()


class _Lane:
    """A daemon thread that runs fn(tokenizer) for one call of `run` after another."""

    def __init__(self, name: str, tokenizer):
        self.tokenizer = tokenizer
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._work, name=name, daemon=True).start()

    def run(self, fn: Callable[[object], T]) -> asyncio.Future:
        """fn(tokenizer)'s result (or exception) as a future of the running event loop;
        cancelling it drops the job unless it has started."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((loop, future, fn))
        return future

    def close(self) -> None:
        self._jobs.put(None)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, future, fn = job
            if future.cancelled():  # its request is gone (a read: safe from this thread)
                continue
            try:
                settle = (future.set_result, fn(self.tokenizer))
            except Exception as e:
                settle = (future.set_exception, e)
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting
                loop.call_soon_threadsafe(_settle, future, *settle)


def _settle(future: asyncio.Future, setter, value) -> None:
    if not future.cancelled():
        setter(value)
