"""Training rows: every turn of every trajectory.

A turn is one conversation an agent returned (rollout/agent_api.py; MemAgent's: a memory update
or the final answer), trained as an independent row: its prompt followed by its response,
every generated token carrying the advantage of the trajectory the turn belongs to
(docs/algorithm.md section 3; multi-conversation DAPO); tokens the agent added between replies
(tool results, user turns) are in the row and carry no loss. A trajectory with more
conversations (MemAgent: more chunks) therefore contributes more rows and more tokens.

Rows live on the host as numpy arrays; batching.py cuts them into the learner's
static-shape micro-batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass
class TrainingRows:
    """R rows right-padded to a common length T (host numpy arrays).

    tokens [R, T] int32: the prompt, then the response, then 0s.
    loss_mask [R, T] float32: 1 where tokens holds a generated response token.
    advantages [R] float32: the row's trajectory's advantage (on each of its response tokens).
    rollout_logprobs [R, T] float32: each response token's log-probability under the sampling
        policy, at its position in tokens; 0 elsewhere.
    prompt_lengths, lengths [R] int32: prompt tokens, prompt + response tokens.
    trajectory [R] int32: index of the row's trajectory in the (flattened) input list.
    turn [R] int32: index of the row's turn in its trajectory.
    final [R] bool: the row is a final-answer turn.
    """
    tokens: np.ndarray
    loss_mask: np.ndarray
    advantages: np.ndarray
    rollout_logprobs: np.ndarray
    prompt_lengths: np.ndarray
    lengths: np.ndarray
    trajectory: np.ndarray
    turn: np.ndarray
    final: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def response_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def token_advantages(self) -> np.ndarray:
        """[R, T] float32: the advantage on every response token, 0 elsewhere."""
        return self.advantages[:, None] * self.loss_mask


def rows_from_trajectories(trajectories: Sequence, advantages) -> TrainingRows:
    """One row per trained turn of every trajectory.

    trajectories: a flat list of `rollout.agent_api.Trajectory`, or a list of groups (lists) of
    them, as `Rollouts.run` returns; advantages: one per trajectory, flat [N] or [G, n]
    matching the grouping. Every row carries its trajectory's whole advantage (the original).
    Turns without response tokens have nothing to train and are left out.
    """
    flat = [t for group in trajectories for t in group] if (
        trajectories and isinstance(trajectories[0], (list, tuple))) else list(trajectories)
    advantages = np.asarray(advantages, np.float32).reshape(-1)
    if len(advantages) != len(flat):
        raise ValueError(f"{len(advantages)} advantages for {len(flat)} trajectories")
    turns = [(i, k, turn) for i, t in enumerate(flat) for k, turn in enumerate(t.turns)
             if len(turn.response_ids)]
    if not turns:
        raise ValueError("no turn with response tokens to train on")
    for _, _, c in turns:
        if len(c.response_logprobs) != len(c.response_ids) or (
                c.response_mask is not None and len(c.response_mask) != len(c.response_ids)):
            raise ValueError("a turn's response_logprobs, response_mask and response_ids "
                             "differ in length")
    lengths = np.array([len(c.prompt_ids) + len(c.response_ids) for _, _, c in turns], np.int32)
    rows, width = len(turns), int(lengths.max())
    tokens = np.zeros((rows, width), np.int32)
    loss_mask = np.zeros((rows, width), np.float32)
    logprobs = np.zeros((rows, width), np.float32)
    prompt_lengths = np.zeros(rows, np.int32)
    for r, (_, _, c) in enumerate(turns):
        p, n = len(c.prompt_ids), len(c.response_ids)
        tokens[r, :p] = c.prompt_ids
        tokens[r, p:p + n] = c.response_ids
        loss_mask[r, p:p + n] = 1.0 if c.response_mask is None else c.response_mask
        logprobs[r, p:p + n] = c.response_logprobs
        prompt_lengths[r] = p
    index = np.array([i for i, _, _ in turns], np.int32)
    return TrainingRows(tokens, loss_mask, advantages[index], logprobs,
                        prompt_lengths, lengths, index,
                        np.array([k for _, k, _ in turns], np.int32),
                        np.array([c.kind == "final" for _, _, c in turns]))
