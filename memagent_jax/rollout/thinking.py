"""`memagent.thinking`: what a thinking model's (Qwen3's) `<think>...</think>` does to the memory
loop (docs/algorithm.md section 7, item 11).

- keep: the chat template as the tokenizer ships it; the reply (stop, EOS and padding ids
  removed) is the next memory, thinking included (the original's trainer);
- strip: the same template; the next memory is the reply after its last `</think>`
  (`strip_thinking_ids` on the local engine's token ids, `strip_thinking_text` on a server's
  text: one rule in two representations, the original's evaluation);
- off: the template rendered with `enable_thinking=False` (Qwen3's switch: its generation
  prompt holds an empty think block); the memory as in keep.

Standard library only: `run`'s parser takes its choices from here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

THINKING_CHOICES = ("keep", "strip", "off")
THINK_END = "</think>"


def template_kwargs(thinking: str) -> dict:
    """The chat template's extra variables for a setting (what vLLM takes as a request's
    `chat_template_kwargs`): {"enable_thinking": False} for off, none otherwise."""
    return {"enable_thinking": False} if thinking == "off" else {}


def strip_thinking_text(reply: str) -> str:
    """A reply's memory under `thinking: strip`, in text (`run_on_server`): the text after the
    last `</think>`, stripped of surrounding whitespace (empty when nothing follows it); a
    reply without `</think>` whole, as it is. The original's `extract_solution`
    (taskutils/memory_eval/utils/__init__.py). The same rule as `strip_thinking_ids`."""
    if THINK_END not in reply:
        return reply
    return reply.rpartition(THINK_END)[2].strip()


def strip_thinking_ids(ids: Sequence[int], think_end: Sequence[int],
                       blank: Callable[[int], bool]) -> list[int]:
    """A reply's memory under `thinking: strip`, in token ids (the local engine): the ids after
    the last occurrence of the sequence `think_end` (`</think>`'s ids), without the leading and
    trailing ids that decode to whitespace only (`blank(id)`); a reply without it whole, as it
    is. The same rule as `strip_thinking_text`."""
    ids, n = list(ids), len(think_end)
    at = next((i for i in range(len(ids) - n, -1, -1) if n and ids[i:i + n] == list(think_end)),
              None)
    if at is None:
        return ids
    rest = ids[at + n:]
    start, end = 0, len(rest)
    while start < end and blank(rest[start]):
        start += 1
    while end > start and blank(rest[end - 1]):
        end -= 1
    return rest[start:end]
