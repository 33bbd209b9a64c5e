"""Batching: the training rows of one update as the learner's jitted steps take them.

Rows (rows.py: one per trained turn, [R, T] host arrays) reach the devices in three cuts:
1. **Mini-batches** (`mini_batches`): per PPO epoch, `learner.mini_batches` optimiser
   updates. With `loss_agg: global_token_mean` the rows are shuffled and every response
   token of a mini-batch weighs 1 / (its token count); with `per_rank_token_mean` they are
   split as verl's data-parallel ranks took them (turn-ordered, contiguous, one piece per
   rank, each cut into contiguous mini-batches) and each token weighs 1 / (ranks x its
   piece's token count).
2. **Micro-batches** (`plan`): a mini-batch's rows as static-shape micro-batches of S
   sequences of one bucket length L, over which the train step accumulates the gradient.
   Packed (`learner.pack`), rows are placed first-fit-decreasing into sequences of the
   longest bucket the token budget holds once per data shard, each row a segment of its own
   (segment ids 1, 2, ... in order, the padding at the end 0): the model attends within a
   segment only and restarts positions at each (models/qwen.py `hidden`), so every row gets
   the values it would get alone, on less padding. Unpacked, a sequence is one row. Either
   way the sequences, longest first, are cut into groups padded to the bucket of their
   longest member and to a count from the token budget (tokens // bucket, a multiple of the
   data-parallel width; the last group of a bucket shrunk to the next power of two that
   holds it), so a handful of shapes compile.
3. **The batch** (`gather`): a plan's arrays, by one schema (`FIELDS`) from which both the
   gathered host arrays and the learner's compiled shapes (`abstract_batch`) come; `scatter`
   puts [S, L] results back where they came from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import jax
import numpy as np

from memagent_jax.errors import UserError
from memagent_jax.rl.config import LearnerConfig
from memagent_jax.rl.rows import TrainingRows

# ---- 1. mini-batches ---------------------------------------------------------------------


def mini_batches(config: LearnerConfig, tokens: np.ndarray, trajectory: np.ndarray,
                 turn: np.ndarray, final: np.ndarray, rng, ranks: int
                 ) -> list[tuple[np.ndarray, np.ndarray]]:
    """One epoch's mini-batches of R rows: [(row indices, [R] weight of each row's tokens)].
    tokens [R]: each row's response tokens; trajectory, turn, final [R]: as `TrainingRows`
    holds them; ranks: per_rank_token_mean's data-parallel ranks when config.loss_agg_ranks is
    not set. A function of lengths and order only (benchmarks/step_projection.py plans with
    it)."""

    def weight(pieces, ranks):
        return 1.0 / (ranks * max(float(tokens[pieces].sum()), 1.0))

    out = []
    if config.loss_agg == "global_token_mean":
        for indices in np.array_split(rng.permutation(len(tokens)), config.mini_batches):
            out.append((indices, np.full(len(tokens), weight(indices, 1), np.float32)))
    else:
        # verl's order: every trajectory's first update, then every second update, ...,
        # then every final answer (its agent answers once all documents are read).
        ranks = config.loss_agg_ranks or ranks
        order = np.lexsort((trajectory, np.where(final, 0, turn), final))
        pieces = [np.array_split(p, config.mini_batches)
                  for p in np.array_split(order, ranks)]
        for m in range(config.mini_batches):
            weights = np.zeros(len(tokens), np.float32)
            for piece in pieces:
                weights[piece[m]] = weight(piece[m], ranks)
            out.append((np.concatenate([piece[m] for piece in pieces]), weights))
    return [(indices, weights) for indices, weights in out if len(indices)]


# ---- 2. micro-batches --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MicroBatchPlan:
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


def plan(config: LearnerConfig, lengths: np.ndarray, indices, row_multiple: int
         ) -> list[MicroBatchPlan]:
    """The micro-batches the learner runs rows `indices` (lengths[i] tokens each) in, as
    `config` asks (bucket_lengths, pack, micro_batch_tokens) on a mesh of `row_multiple`
    data-parallel shards."""
    indices = list(indices)
    buckets = config.bucket_lengths or default_bucket_lengths(
        int(max(lengths[i] for i in indices)))
    return plan_sequences(lengths, indices, buckets, pack=config.pack,
                          tokens=config.micro_batch_tokens, row_multiple=row_multiple)


def plan_sequences(lengths: np.ndarray, indices, buckets: Sequence[int], *, pack: bool,
                   tokens: int, row_multiple: int = 1) -> list[MicroBatchPlan]:
    """Rows `indices` as micro-batches of sequences, each of tokens // bucket sequences in
    multiples of `row_multiple` (`_groups`). pack: first-fit-decreasing into sequences of the
    longest bucket of which `row_multiple` fit the token budget (never shorter than the bucket
    of the longest row, whose too long rows get `bucket_length`'s error), each then padded to
    the bucket of its filled length; else one row per sequence."""
    indices = list(indices)
    if not pack:
        return [_layout([[r] for r in index if r >= 0], lengths, len(index), length, False)
                for index, length in _groups(lengths, indices, buckets, tokens, row_multiple)]
    longest = bucket_length(int(max(lengths[i] for i in indices)), buckets)
    within = [b for b in buckets if b * row_multiple <= tokens]
    bins = first_fit_decreasing(lengths, indices, max([longest] + within))
    filled = np.array([sum(int(lengths[r]) for r in members) for members in bins])
    return [_layout([bins[b] for b in index if b >= 0], lengths, len(index), length, True)
            for index, length in _groups(filled, range(len(bins)), buckets, tokens,
                                         row_multiple)]


def _groups(lengths: np.ndarray, indices: Iterable[int], buckets: Sequence[int], tokens: int,
            row_multiple: int) -> list[tuple[np.ndarray, int]]:
    """Items `indices` (lengths[i] tokens each: rows or packed sequences) cut into groups of
    static shapes: [(index [B], -1 for padding; the bucket length every item is padded to)].

    Each group is padded to the bucket of its longest item and holds tokens // bucket items;
    counts are multiples of `row_multiple` (the data-parallel
    width, so the batch splits evenly over devices). Items are taken longest first, so each
    group spans a narrow range of lengths; the final group of a bucket is shrunk to the next
    power of two (times row_multiple) that holds it rather than padded with empty items."""
    order = sorted(indices, key=lambda i: -int(lengths[i]))
    groups, start = [], 0
    while start < len(order):
        bucket = bucket_length(int(lengths[order[start]]), buckets)
        capacity = max(1, tokens // bucket)
        capacity = max(row_multiple, capacity // row_multiple * row_multiple)
        left = len(order) - start
        if left < capacity:
            units = -(-left // row_multiple)  # ceil
            capacity = min(capacity, row_multiple * (1 << (units - 1).bit_length()))
        taken = order[start:start + capacity]
        index = np.full(capacity, -1, np.int64)
        index[:len(taken)] = taken
        groups.append((index, bucket))
        start += len(taken)
    return groups


def _layout(bins: Sequence[Sequence[int]], lengths: np.ndarray, count: int, length: int,
            packed: bool) -> MicroBatchPlan:
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
    return MicroBatchPlan(row, offset, segment, packed)


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


def default_bucket_lengths(max_length: int, smallest: int = 64) -> tuple[int, ...]:
    """Powers of two from `smallest` up to the first one >= max_length."""
    buckets = [smallest]
    while buckets[-1] < max_length:
        buckets.append(buckets[-1] * 2)
    return tuple(buckets)


def bucket_length(length: int, buckets: Sequence[int]) -> int:
    """The smallest of `buckets` that holds a row of `length` tokens."""
    for bucket in sorted(buckets):
        if length <= bucket:
            return bucket
    raise UserError(f"a training row of {length} tokens exceeds the largest bucket length "
                    f"{max(buckets)} (raise the learner's bucket lengths)")


def padded_fraction(plans: Sequence[MicroBatchPlan]) -> float:
    """The share of the plans' token slots that hold no row's token."""
    slots = sum(p.row.size for p in plans)
    return 1.0 - sum(int((p.row >= 0).sum()) for p in plans) / max(slots, 1)


# ---- 3. the batch ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Field:
    """One array of a micro-batch. source: "token" (an [R, T] array of the rows, gathered to
    [S, L]), "row" (an [R] array, each row's value on all its tokens, [S, L]), "segment" (the
    plan's segment ids [S, L]) or "positions" (the LM head's positions [S, W])."""
    dtype: str
    source: str


# Every array a micro-batch may carry; `batch_fields` says which a learner's does.
FIELDS = {
    "tokens": Field("int32", "token"),
    "segment_ids": Field("int32", "segment"),     # packed only
    "positions": Field("int32", "positions"),
    "loss_mask": Field("float32", "token"),
    "old_logprobs": Field("float32", "token"),
    "ref_logprobs": Field("float32", "token"),    # with a KL term only
    "is_weights": Field("float32", "token"),      # with rollout_correction only
    "advantages": Field("float32", "row"),
    "row_weights": Field("float32", "row"),
}
# What the forward reads (the log-prob pass takes nothing else).
FORWARD = ("tokens", "segment_ids", "positions")


def batch_fields(config: LearnerConfig, reference: bool) -> tuple[str, ...]:
    """The fields of a train step's micro-batch under `config` (reference: a KL term)."""
    skip = {"segment_ids": not config.pack, "ref_logprobs": not reference,
            "is_weights": config.rollout_correction is None}
    return tuple(name for name in FIELDS if not skip.get(name, False))


def forward_fields(names: Sequence[str]) -> tuple[str, ...]:
    """The forward's share of `names`."""
    return tuple(name for name in FORWARD if name in names)


def gather(plan: MicroBatchPlan, rows: TrainingRows, names: Sequence[str],
           arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The plan's micro-batch of fields `names`: [S, L] (positions [S, W]), 0 on padding.
    tokens, loss_mask and advantages come from `rows`, every other token or row field from
    `arrays` ([R, T] or [R])."""
    valid = plan.row >= 0
    index = np.where(valid, plan.row, 0)
    source = {"tokens": rows.tokens, "loss_mask": rows.loss_mask,
              "advantages": rows.advantages, **arrays}
    out = {}
    for name in names:
        field = FIELDS[name]
        if field.source == "segment":
            value = plan.segment
        elif field.source == "positions":
            value = response_positions(plan, rows.prompt_lengths, rows.lengths)
        elif field.source == "row":
            value = np.where(valid, source[name][index], 0)
        else:
            array = source[name]
            value = np.where(valid, array[index, np.minimum(plan.offset, array.shape[1] - 1)], 0)
        out[name] = value.astype(field.dtype)
    return out


def abstract_batch(names: Sequence[str], sequences: int, length: int, width: int,
                   sharding) -> dict[str, jax.ShapeDtypeStruct]:
    """The shapes and dtypes `gather` gives for a plan of `sequences` x `length` with `width`
    head positions, on `sharding` (for compiling without data)."""
    return {name: jax.ShapeDtypeStruct(
        (sequences, width if FIELDS[name].source == "positions" else length),
        FIELDS[name].dtype, sharding=sharding) for name in names}


def response_positions(plan: MicroBatchPlan, prompt_lengths: np.ndarray,
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


def scatter(plan: MicroBatchPlan, values: np.ndarray, into: np.ndarray) -> None:
    """Writes a micro-batch's [S, L] values back to their rows' places in into [R, T] (in
    place)."""
    valid = plan.row >= 0
    into[plan.row[valid], plan.offset[valid]] = values[valid]
