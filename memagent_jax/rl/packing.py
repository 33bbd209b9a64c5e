"""Micro-batches of sequences: training rows packed several to a sequence, or one each.

A micro-batch is S sequences of one bucket length L. Packed (`learner.pack`), rows are placed
first-fit-decreasing into sequences of the longest bucket the token budget holds once per
data shard, each row a segment of its own (segment ids 1, 2, ... in order, the padding at the
end 0): the model attends within a segment only and restarts positions at each
(models/qwen.py `hidden`), so every row gets the values it would get alone, on less padding
(a sequence holds whole rows only: BENCHMARKS.md, "Packed learner rows"). The sequences are
then cut into micro-batches as rows.py cuts rows (by the bucket of their filled length, at
the same token budget). Unpacked, each sequence is one row, the micro-batches rows.py's.

Either way the learner sees one layout: per-token arrays [S, L] gathered from the rows' [R, T]
ones (per-row values broadcast to their tokens), the positions [S, W] where the LM head runs
(every response token, packed left in each sequence; W a power of two), and `scatter` puts
[S, L] results back where they came from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from memagent_jax.rl.rows import bucket_length, plan_micro_batches


@dataclasses.dataclass(frozen=True)
class SequencePlan:
    """One micro-batch of S sequences of `length` tokens.

    row [S, L] int64: the row (of TrainingRows) each token comes from, -1 for padding;
    offset [S, L] int64: the token's position in that row (0 for padding);
    segment [S, L] int32: 1, 2, ... for the rows of a sequence in order, 0 for padding;
    packed: whether the sequences carry several rows (the model then needs `segment`).
    """
    row: np.ndarray
    offset: np.ndarray
    segment: np.ndarray
    packed: bool

    @property
    def length(self) -> int:
        return self.row.shape[1]

    @property
    def sequences(self) -> int:
        return self.row.shape[0]


def _layout(bins: Sequence[Sequence[int]], lengths: np.ndarray, count: int, length: int,
            packed: bool) -> SequencePlan:
    """The plan of `count` sequences of `length` tokens, sequence s holding bins[s]'s rows
    end to end (sequences past len(bins) are padding)."""
    row = np.full((count, length), -1, np.int64)
    offset = np.zeros((count, length), np.int64)
    segment = np.zeros((count, length), np.int32)
    for s, members in enumerate(bins):
        at = 0
        for k, r in enumerate(members):
            n = int(lengths[r])
            row[s, at:at + n] = r
            offset[s, at:at + n] = np.arange(n)
            segment[s, at:at + n] = k + 1
            at += n
    return SequencePlan(row, offset, segment, packed)


def first_fit_decreasing(lengths: np.ndarray, indices, capacity: int) -> list[list[int]]:
    """Rows `indices` (lengths[i] tokens each, none over `capacity`) placed longest first, each
    into the first bin with room for it (a new bin when none has): the bins' row lists, in
    the order the bins were opened."""
    order = sorted(indices, key=lambda i: -int(lengths[i]))
    room = np.zeros(len(order), np.int64)  # free tokens per opened bin (at most one per row)
    bins: list[list[int]] = []
    for i in order:
        n = int(lengths[i])
        fits = np.flatnonzero(room[:len(bins)] >= n)
        if len(fits):
            b = int(fits[0])
        else:
            b = len(bins)
            bins.append([])
            room[b] = capacity
        bins[b].append(i)
        room[b] -= n
    return bins


def plan_sequences(lengths: np.ndarray, indices, buckets: Sequence[int], *, pack: bool,
                   rows: int | None = None, tokens: int | None = None,
                   row_multiple: int = 1) -> list[SequencePlan]:
    """Rows `indices` as micro-batches of sequences: each of `rows` sequences, or of
    tokens // bucket, in multiples of `row_multiple` (rows.py `plan_micro_batches`). pack:
    first-fit-decreasing into sequences of the longest bucket of which `row_multiple` fit the
    token budget (with `rows`: the longest bucket; never shorter than the bucket of the
    longest row, whose too long rows get rows.py's error), each then padded to the bucket of
    its filled length; else one row per sequence."""
    indices = list(indices)
    if not pack:
        return [_layout([[r] for r in plan.index if r >= 0], lengths, len(plan.index),
                        plan.length, False)
                for plan in plan_micro_batches(lengths, indices, buckets, rows=rows,
                                               tokens=tokens, row_multiple=row_multiple)]
    longest = bucket_length(int(max(lengths[i] for i in indices)), buckets)
    # A row count (no token budget) packs into the longest row's bucket: the micro-batches'
    # shape stays what unpacked rows would give.
    within = [b for b in buckets if tokens is not None and b * row_multiple <= tokens]
    capacity = max([longest] + within)
    bins = first_fit_decreasing(lengths, indices, capacity)
    filled = np.array([sum(int(lengths[r]) for r in members) for members in bins])
    plans = plan_micro_batches(filled, range(len(bins)), buckets, rows=rows, tokens=tokens,
                               row_multiple=row_multiple)
    return [_layout([bins[b] for b in plan.index if b >= 0], lengths, len(plan.index),
                    plan.length, True) for plan in plans]


def gather(plan: SequencePlan, per_token: dict[str, np.ndarray],
           per_row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The plan's tokens of each array: per_token [R, T] arrays and per_row [R] arrays (each
    row's value on all its tokens) -> [S, L], 0 on padding."""
    valid = plan.row >= 0
    rows = np.where(valid, plan.row, 0)
    out = {}
    for name, array in per_token.items():
        offsets = np.minimum(plan.offset, array.shape[1] - 1)
        out[name] = np.where(valid, array[rows, offsets], 0).astype(array.dtype)
    for name, array in per_row.items():
        out[name] = np.where(valid, array[rows], 0).astype(array.dtype)
    return out


def response_positions(plan: SequencePlan, prompt_lengths: np.ndarray,
                       lengths: np.ndarray) -> np.ndarray:
    """[S, W] int32: the positions of each sequence's response tokens (its rows' positions
    prompt_length .. length - 1), in order, then L (out of range: dropped) up to W, the
    largest count rounded up to a power of two (at least 16, at most L): one compile per
    value, and the LM head's cost stays that of the responses."""
    valid = plan.row >= 0
    rows = np.where(valid, plan.row, 0)
    response = valid & (plan.offset >= prompt_lengths[rows]) & (plan.offset < lengths[rows])
    counts = response.sum(axis=1)
    longest = max(int(counts.max()), 1)
    width = min(plan.length, max(16, 1 << (longest - 1).bit_length()))
    positions = np.full((plan.sequences, width), plan.length, np.int32)
    for s in range(plan.sequences):
        where = np.flatnonzero(response[s])
        positions[s, :len(where)] = where
    return positions


def scatter(plan: SequencePlan, values: np.ndarray, into: np.ndarray) -> None:
    """Writes a micro-batch's [S, L] values back to their rows' places in into [R, T] (in
    place)."""
    valid = plan.row >= 0
    into[plan.row[valid], plan.offset[valid]] = values[valid]


def padded_fraction(plans: Sequence[SequencePlan]) -> float:
    """The share of the plans' token slots that hold no row's token."""
    slots = sum(p.row.size for p in plans)
    return 1.0 - sum(int((p.row >= 0).sum()) for p in plans) / max(slots, 1)
