"""What is trained, for a person to read: trajectories through the one code path that makes
training rows (`rows.rows_from_trajectories`), shown with their trained tokens marked (`run
--show-tokens`) or kept as JSON (a training run's `logs/rollouts.jsonl`).

A row is one trained conversation (rl/rows.py): its ids, 1 in its loss mask on the tokens the
engine generated (they carry the loss and their behaviour log-probs), 0 on the prompt and on
everything the agent or the chat template added (user and tool turns, separators).
"""

from __future__ import annotations

import math

import numpy as np

from memagent_jax.rl.rows import TrainingRows, rows_from_trajectories
from memagent_jax.rollout.agent_api import Trajectory

# Around each span of trained tokens, in the text and in the ids.
OPEN, CLOSE = "\u27e6", "\u27e7"


def trained_rows(trajectories: list[Trajectory]) -> TrainingRows | None:
    """The rows `trajectories` train (advantage 0 each); None where nothing is trained (every
    rollout timed out, or a server's text-only turns)."""
    if not any(len(turn.response_ids) for t in trajectories for turn in t.turns):
        return None
    return rows_from_trajectories(trajectories, np.zeros(len(trajectories)))


def show_tokens(trajectory: Trajectory, tokenizer) -> str:
    """Each conversation `trajectory` trains, as the text of its ids and as the ids, the
    trained spans between OPEN and CLOSE (module docstring)."""
    rows = trained_rows([trajectory])
    if rows is None:
        return "nothing is trained: " + ("the rollout passed its deadline" if
                                         trajectory.timed_out else "no conversation holds ids")
    out = []
    for r in range(len(rows)):
        n = int(rows.lengths[r])
        ids, mask = rows.tokens[r, :n].tolist(), rows.loss_mask[r, :n]
        kind = trajectory.turns[int(rows.turn[r])].kind
        out.append(f"--- conversation {r + 1}/{len(rows)} ({kind}): {n} tokens, "
                   f"{int(mask.sum())} trained (between {OPEN} {CLOSE})")
        spans = _spans(mask)
        out.append("".join(_marked(tokenizer.decode(ids[a:b], skip_special_tokens=False), m)
                           for a, b, m in spans))
        out.append("ids: " + " ".join(_marked(" ".join(map(str, ids[a:b])), m)
                                      for a, b, m in spans))
    return "\n".join(out)


def rollout_records(step: int, groups: list[list[Trajectory]], rewards: np.ndarray,
                    advantages: np.ndarray, count: int) -> list[dict]:
    """`logs/rollouts.jsonl`'s lines for step `step`: the first `count` trajectories of
    `groups` as trained (rewards [G, n] of the first groups: a group beyond them, a supervised
    step's extra trajectory, has none; advantages, one per trajectory of `groups`), each
    {"step", "group", "sample", "problem", "answer", "timed_out", "reward", "advantage",
    "conversations": [{"kind", "messages", "ids", "loss_mask", "logprobs"} per trained
    row]}. A reward that is none (a
    timed-out rollout's) is null."""
    flat = [(g, j, t) for g, group in enumerate(groups) for j, t in enumerate(group)][:count]
    advantages = np.asarray(advantages, np.float32).reshape(-1)
    rows = trained_rows([t for _, _, t in flat])
    records = []
    for i, (g, j, trajectory) in enumerate(flat):
        scored = g < len(rewards)
        conversations = []
        for r in (np.flatnonzero(rows.trajectory == i) if rows is not None else []):
            assert rows is not None
            n = int(rows.lengths[r])
            turn = trajectory.turns[int(rows.turn[r])]
            conversations.append({
                "kind": turn.kind,
                "messages": [dict(m) for m in turn.messages or []],
                "ids": rows.tokens[r, :n].tolist(),
                "loss_mask": rows.loss_mask[r, :n].astype(int).tolist(),
                "logprobs": rows.rollout_logprobs[r, :n].tolist()})
        records.append({"step": step, "group": g, "sample": j, "problem": trajectory.problem,
                        "answer": trajectory.answer, "timed_out": trajectory.timed_out,
                        "reward": _number(rewards[g, j]) if scored else None,
                        "advantage": _number(advantages[i]),
                        "conversations": conversations})
    return records


def _spans(mask: np.ndarray) -> list[tuple[int, int, bool]]:
    """(start, end, trained) of each run of equal mask values."""
    spans: list[tuple[int, int, bool]] = []
    for t, m in enumerate(mask > 0):
        if spans and spans[-1][2] == m:
            spans[-1] = (spans[-1][0], t + 1, bool(m))
        else:
            spans.append((t, t + 1, bool(m)))
    return spans


def _marked(text: str, trained: bool) -> str:
    return f"{OPEN}{text}{CLOSE}" if trained else text


def _number(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
