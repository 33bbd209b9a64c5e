"""What a long command shows on stderr besides its results: the block that says what it is
about to do (`announce`), and its progress (`progress_bar`).

A progress bar is tqdm's bar where stderr is a terminal. Anywhere else (a log file, a pipe, a
cluster job's captured output) tqdm's carriage-return redraws pile up (a 5-minute eval wrote
173 KB of them), so there the bar's text is a plain line every `LINE_EVERY_S` seconds and once
at the end: a log that says how far the work got, at a few lines an hour.

Standard library only at import (command modules import it): tqdm loads with the first bar.
"""

from __future__ import annotations

import functools
import sys

from memagent_jax.distributed import collectives  # stdlib-only at import

LINE_EVERY_S = 30.0  # seconds between a bar's lines off a terminal


def progress_bar(iterable=None, **kwargs):
    """`tqdm(iterable, **kwargs)` on stderr (or `file`), as tqdm draws it on a terminal, else
    as plain lines (the module docstring); kwargs are tqdm's (total, desc, unit, initial,
    position, disable, ...)."""
    from tqdm import tqdm
    kwargs.setdefault("file", sys.stderr)
    if _is_terminal(kwargs["file"]):
        return tqdm(iterable, dynamic_ncols=True, **kwargs)
    return _plain_bar()(iterable, ascii=True, **kwargs)


def announce(title: str, items: dict[str, str]) -> None:
    """What a command is about to do, before its work starts: `title`, then one line per item
    (name, value), on stderr, from process 0 of a job only."""
    if not collectives.is_main():
        return
    width = max(map(len, items))
    lines = [title, *(f"  {name:<{width}}  {value}" for name, value in items.items())]
    print("\n".join(lines), file=sys.stderr, flush=True)


def _is_terminal(file) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


@functools.cache
def _plain_bar():
    """The tqdm class for bars off a terminal (made on first use: tqdm loads lazily)."""
    from tqdm import tqdm

    class PlainBar(tqdm):
        """tqdm whose every redraw (an update, a postfix, tqdm.write putting the bar back)
        prints the bar's text as a line only when LINE_EVERY_S have passed since its last
        line, and which never writes a carriage return or a cursor move."""

        def __init__(self, *args, **kwargs):
            self._line_at = None  # set before tqdm's __init__ draws the bar for the first time
            super().__init__(*args, **kwargs)

        def display(self, msg=None, pos=None):
            now = self._time()
            if self._line_at is None:
                self._line_at = now  # the bar's start: its first line comes LINE_EVERY_S later
            elif msg is None and now - self._line_at >= LINE_EVERY_S:
                self._line(now)
            return False  # nothing on screen for tqdm to clear

        def clear(self, nolock=False):
            pass  # tqdm.write clears bars before it writes: there is nothing to clear

        def close(self):
            if not self.disable:
                self._line(self._time())  # where the work ended, whenever that is
            self.leave = False  # tqdm's own close then only clears, which is nothing
            super().close()

        def _line(self, now: float) -> None:
            self._line_at = now
            self.fp.write(f"{self}\n")
            self.fp.flush()

    return PlainBar
