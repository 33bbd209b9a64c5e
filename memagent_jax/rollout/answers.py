"""The final answer inside a reply: the last \\boxed{...} (or \\fbox{...}) near its end."""

from __future__ import annotations

ANSWER_WINDOW = 300  # characters at the end of the reply searched, as the original


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} or \\fbox{...} in the last 300 characters of text,
    braces balanced (so \\boxed{\\frac{1}{2}} gives \\frac{1}{2}); None when there is none."""
    tail = text[-ANSWER_WINDOW:]
    start = max(tail.rfind("\\boxed"), tail.rfind("\\fbox"))
    if start < 0:
        return None
    open_at = tail.find("{", start)
    if open_at < 0 or tail[start:open_at].strip() not in ("\\boxed", "\\fbox"):
        return None
    depth = 0
    for i in range(open_at, len(tail)):
        if tail[i] == "{":
            depth += 1
        elif tail[i] == "}":
            depth -= 1
            if depth == 0:
                return tail[open_at + 1:i]
    return None  # unbalanced: the reply was cut inside the box
