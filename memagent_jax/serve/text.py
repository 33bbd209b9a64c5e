"""One choice's reply as it grows: token ids in, text out, stop strings applied.

Text is decoded incrementally, as vLLM and TGI do: each new token is decoded together with the
few before it, and the text it adds is the difference, held back while it ends in an
incomplete UTF-8 character (U+FFFD); special tokens (EOS) add no text. A streamed reply and the
whole reply are the same text. Stop strings follow OpenAI: the reply ends before the first
occurrence of any of them, which is not returned; text that could still become the start of
one is held back until it cannot.
"""

from __future__ import annotations


class TextStream:
    """tokenizer: decodes ids (`decode(ids, skip_special_tokens=True)`); stop: stop strings.

    `add(token)` returns the text that became final with it ("" while held back); `finish()`
    the rest once the engine has finished the choice. `stopped` turns true when a stop string
    appears; the choice takes no more tokens, and `text` is the reply without it."""

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer, self.stop = tokenizer, stop
        self.ids: list[int] = []
        self.text = ""          # the reply so far, stop string and held text excluded
        self.stopped = False
        self._pending = ""      # decoded, not yet returned: may start a stop string
        self._prefix = 0        # ids[prefix:read] decode to the text already taken from them
        self._read = 0
        self._hold = max((len(s) for s in stop), default=1) - 1

    def add(self, token: int) -> str:
        if self.stopped:
            raise ValueError("a stopped reply takes no more tokens")
        self.ids.append(token)
        before = self._decode(self.ids[self._prefix:self._read])
        after = self._decode(self.ids[self._prefix:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""  # nothing yet: a special token, or part of a character
        self._prefix, self._read = self._read, len(self.ids)
        self._pending += after[len(before):]
        return self._release(final=False)

    @property
    def decoded_length(self) -> int:
        """Characters decoded so far, held text included (where the next token's text
        starts)."""
        return len(self.text) + len(self._pending)

    def finish(self) -> str:
        """The text held back, now final (the engine stopped: EOS or the length limit)."""
        return "" if self.stopped else self._release(final=True)

    def _release(self, final: bool) -> str:
        # A stop string ending in the new text starts at most _hold characters before it;
        # one ending earlier would have been found then, so every match starts in _pending.
        tail = self.text[len(self.text) - self._hold:] if self._hold else ""
        window = tail + self._pending
        found = [i for i in (window.find(s) for s in self.stop) if i >= 0]
        if found:
            self.stopped = True
            out, self._pending = self._pending[:min(found) - len(tail)], ""
        else:
            keep = 0 if final else min(self._hold, len(self._pending))
            out = self._pending[:len(self._pending) - keep]
            self._pending = self._pending[len(out):]
        self.text += out
        return out

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if ids else ""
