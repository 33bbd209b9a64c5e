"""The RL training step's time on paper: a train config's rollout and update on its target chips
(8 x H100 for `cudnn` configs, a TPU v5p slice for `splash` ones), from FLOP and byte counts
at rates measured on real chips where BENCHMARKS.md has them and at stated assumptions where it
does not. Nothing runs on an accelerator; every assumption is printed beside what it drives.

    python benchmarks/step_projection.py --config configs/train/qwen2.5-7b_gpu8.yaml
    python benchmarks/step_projection.py --config configs/train/qwen2.5-7b_tpu_v5p.yaml

The batch: prompts_per_step x rollout.n trajectories of MemAgent-shaped turns at the config's
budgets (benchmarks/memagent_rows.py, its distributions printed).
- Rollout, in the engine's layout (models/sharding.py ROLLOUT_RULES): each turn's prompt
  prefilled once (a group's first turn once for its n samples), `engine.prefill_rows` prompts a
  call in arrival order, padded to the longest one's bucket; a call's rows split over the slot
  groups (data x fsdp) their count divides, each group's rows on its tensor split of the bf16
  weights; every prefix then gathered by every group over the interconnect. Decode:
  engine.slots slots kept full (prompts are prefilled ahead of their slots), slots split over
  data x fsdp; every step each chip reads its tensor split of the bf16 weights
  and its slots' KV cache (held once: KV heads over tensor, or slots over it too where it
  cannot split the heads), as the engine holds it: every slot up to the cache length of the
  longest busy slot, taken as the longest turn's (a group's slots nearly always hold an update
  turn); beside it, each slot up to its own filled length (a ragged read), and every slot's
  whole max_len. The engine's copy is gathered from the learner's fsdp shards once a
  rollout. Prefill and decode take turns on the chips, so their times add.
- Update (rl/learner.py): the old-log-prob recompute (with `learner.old_logprobs: recompute`)
  and the KL reference pass (when kl_coef != 0) over every row, then per PPO epoch each mini-batch's
  forward and backward (the backward
  twice the forward; what the config's remat policy recomputes, flops.train; the LM head's,
  whose logit chunks are rematerialised) over all chips. Token counts, one column each
  (`TOKEN_COUNTS`): "padded"
  a row a sequence at its bucket (`learner.pack: false`), "packed" rows packed several to a
  sequence (`learner.pack: true`; both as rl/batching.py plans them per mini-batch), "real" the
  rows' own tokens.
FLOPs: benchmarks/flops.py (PaLM's convention, as the measured utilisations count them).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable

import flops as flop_model
import memagent_rows
import numpy as np

from memagent_jax.errors import ConfigError, UserError
from memagent_jax.models.config import ModelConfig
from memagent_jax.rl import batching
from memagent_jax.rl.config import TrainConfig, load_train_config

TEMPLATE_TOKENS = 256   # the chat templates' share of the KV length (as benchmarks/aot.py)


@dataclasses.dataclass(frozen=True)
class Rate:
    """A per-chip rate and where it comes from (a BENCHMARKS.md row, or an assumption)."""
    value: float
    source: str


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    train: Rate     # FLOP/s of the learner's forward and backward
    prefill: Rate   # FLOP/s of a prefill
    decode: Rate    # bytes/s a decode step reads from HBM
    link: Rate      # bytes/s a chip receives from the others (a gather's rate)


H100_MATMUL = 670e12  # bf16 8192-square matmul, BENCHMARKS.md "Learner update", H100 table
CHIPS = {
    "h100": Chip(
        "NVIDIA H100 80GB",
        Rate(0.317 * H100_MATMUL, "measured: 31.7% of a 670 TFLOP/s bf16 matmul, learner "
             "update 0.5B cudnn (BENCHMARKS.md, h100, 82df67f); assumed to hold at 7B, 8K rows, "
             "remat, FSDP over NVLink"),
        Rate(0.317 * H100_MATMUL, "assumed: the learner's forward rate above (no 7B prefill "
             "measured on a GPU)"),
        Rate(1723e9, "measured: 7B decode at batch 64 reads 1723 GB/s, 63% of copy "
             "(BENCHMARKS.md decode, h100, 82df67f; 68% at batch 1, 76% at 16)"),
        Rate(450e9 / 2, "assumed: half NVLink 4's 450 GB/s a direction (no gather measured)")),
    "v5p": Chip(
        "TPU v5p",
        Rate(0.30 * 459e12, "assumed: 30% of the 459 TFLOP/s bf16 vendor peak (no TPU "
             "measured; the H100 learner reaches 21% of its 989 vendor peak)"),
        Rate(0.30 * 459e12, "assumed: as the update"),
        Rate(0.65 * 2765e9, "assumed: 65% of the 2765 GB/s vendor HBM bandwidth (the H100 "
             "decode reads at 63-76% of its measured copy rate)"),
        Rate(600e9 / 4, "assumed: a quarter of the vendor's 4800 Gbit/s ICI a chip (no "
             "gather measured)")),
}
TARGETS = {"cudnn": "h100", "splash": "v5p"}  # a config's attention kernel names its chip

# #31: BytedTsinghua-SIA/MemAgent issue 31 (2026-03-30), the original's 7B recipe reproduced.
ORIGINAL = {"chips": 32, "step_s": 2400.0, "update_s": 2100.0}


@dataclasses.dataclass(frozen=True)
class Rows:
    """One step's training rows, one per turn: prompt and response tokens, trajectory, turn (its
    index in the trajectory), final [R]; length their tokens."""
    prompt: np.ndarray
    response: np.ndarray
    trajectory: np.ndarray
    turn: np.ndarray
    final: np.ndarray

    @property
    def length(self) -> np.ndarray:
        return self.prompt + self.response


def step_rows(config: TrainConfig) -> Rows:
    """The MemAgent-shaped turns of prompts_per_step x n trajectories at the config's budgets."""
    m = config.memagent
    if m.max_chunks is None:
        raise ConfigError("memagent.max_chunks", "the projection needs the training documents' "
                                                 "chunk cap (the 7B configs' 8)")
    if m.max_memory_tokens < memagent_rows.MEMORY_MIN:
        raise ConfigError("memagent.max_memory_tokens", f"{m.max_memory_tokens} is below the "
                          f"shortest memory the assumed rows draw ({memagent_rows.MEMORY_MIN})")
    t = memagent_rows.turn_lengths(config.prompts_per_step * config.rollout.n,
                                   chunk=m.chunk_tokens, memory=m.max_memory_tokens,
                                   max_chunks=m.max_chunks, seed=config.seed)
    starts = np.r_[0, np.flatnonzero(np.diff(t.document)) + 1]
    turn = np.arange(len(t.document)) - np.repeat(starts, np.diff(np.r_[starts, len(t.document)]))
    return Rows(t.prompt, t.response, t.document, turn, t.final)


@dataclasses.dataclass(frozen=True)
class Setup:
    """What the projection reads: the config, the model's shape, the mesh's axis sizes, the
    target chip, the step's rows and the engine's KV length and prefill buckets."""
    config: TrainConfig
    shape: ModelConfig
    axes: dict[str, int]
    chip: Chip
    rows: Rows
    max_len: int
    buckets: tuple[int, ...]
    cache_length: int   # the engine's KV length while the longest turn decodes

    @property
    def chips(self) -> int:
        return int(np.prod(list(self.axes.values())))


def setup(config: TrainConfig, chip: str | None = None, preset: str | None = None) -> Setup:
    """Raises ConfigError (one line, naming the key) for what the projection cannot read."""
    for axis, size in config.mesh.items():
        if size < 1:
            raise ConfigError(f"mesh.{axis}", f"{size} takes the devices left over; the "
                                              "projection needs every axis's size")
    chip = chip or TARGETS.get(config.model.attention)
    if chip is None:
        targets = ", ".join(f"{k}: {v}" for k, v in TARGETS.items())
        raise ConfigError("model.attention", f"{config.model.attention!r} names no target chip "
                                             f"({targets}); give --chip")
    m = config.model
    shape = flop_model.model_shape(m, preset)
    budgets = config.memagent
    engine = config.engine.sized_for(budgets.chunk_tokens + budgets.max_memory_tokens
                                     + budgets.max_problem_tokens + budgets.max_final_tokens
                                     + TEMPLATE_TOKENS)
    axes = {axis: config.mesh.get(axis, 1) for axis in ("data", "fsdp", "tensor")}
    rows = step_rows(config)
    longest = int((rows.prompt + rows.response).max())
    cache_length = next(n for n in engine.cache_lengths() if n >= longest)
    return Setup(config, shape, axes, CHIPS[chip], rows, engine.max_len, engine.buckets(),
                 cache_length)


# ---- the update ------------------------------------------------------------------------

def _planned(s: Setup, indices, pack: bool) -> flop_model.Work:
    """The micro-batches of sequences the learner plans for rows `indices` (batching.plan),
    the LM head on each sequence's response positions (batching.response_positions); attention
    over the whole sequence (causal, as PaLM's convention counts it), or packed within each row
    (a segment) and within the padding."""
    rows = s.rows
    plans = batching.plan(dataclasses.replace(s.config.learner, pack=pack), rows.length, indices,
                          s.axes["data"] * s.axes["fsdp"])
    work = flop_model.Work()
    for plan in plans:
        head = batching.response_positions(plan, rows.prompt, rows.length).shape[1]
        attended = plan.sequences * float(plan.length) ** 2
        if plan.packed:
            segments = [np.bincount(segment)[1:].astype(float) for segment in plan.segment]
            attended = sum((n ** 2).sum() + (plan.length - n.sum()) ** 2 for n in segments)
        work = work + flop_model.Work(plan.sequences * plan.length, attended,
                                      plan.sequences * head)
    return work


def padded(s: Setup, indices) -> flop_model.Work:
    """A row a sequence, padded to its bucket (`learner.pack: false`)."""
    return _planned(s, indices, pack=False)


def packed(s: Setup, indices) -> flop_model.Work:
    """Rows packed several to a sequence (`learner.pack: true`, rl/batching.py)."""
    return _planned(s, indices, pack=True)


def real(s: Setup, indices) -> flop_model.Work:
    """The rows' own tokens: no padding, the LM head on response tokens only."""
    index = np.asarray(list(indices))
    length = s.rows.length[index].astype(float)
    return flop_model.Work(length.sum(), (length ** 2).sum(), float(s.rows.response[index].sum()))


# name -> work(setup, row indices): one more way of counting tokens is one more entry.
TOKEN_COUNTS: dict[str, Callable] = {"padded": padded, "packed": packed, "real": real}


# How the forward and backward is counted (flops.train): the config's own learner (its
# learner.lora merged into the base in the step, as rl/learner.py runs it), every weight
# trained, or LoRA with unmerged adapters ("LoRA Without Regret"'s count).
TRAINED = ("as configured", "full-parameter", "LoRA unmerged")


def update_passes(s: Setup, count: Callable,
                  trained: str = TRAINED[0]) -> dict[str, tuple[float, float]]:
    """{pass: (tokens, FLOPs)} of the update's passes over the step's rows, counted by
    `count`, the forward and backward as `trained` (TRAINED) says."""
    learner, rows = s.config.learner, s.rows
    everything = count(s, range(len(rows.prompt)))
    passes = {}
    forward = everything.tokens, flop_model.forward(s.shape, everything)
    if learner.old_logprobs == "recompute":
        passes["old log-probs (forward)"] = forward
    if learner.kl_coef != 0:
        passes["KL reference (forward)"] = forward
    # The learner's mini-batches (global_token_mean's shuffle seed changes which rows share a
    # micro-batch, not the padding's share by much; per_rank_token_mean's split is fixed).
    split = batching.mini_batches(learner, rows.response, rows.trajectory, rows.turn, rows.final,
                         np.random.default_rng(0), s.axes["data"] * s.axes["fsdp"])
    work = sum((count(s, indices) for indices, _ in split), flop_model.Work())
    train = flop_model.train(s.shape, work, remat=learner.remat,
                             head_remat=learner.logit_chunk_tokens is not None,
                             lora=None if trained == TRAINED[1] else learner.lora,
                             merged=trained == TRAINED[0])
    passes["train (forward + backward)"] = (learner.ppo_epochs * work.tokens,
                                            learner.ppo_epochs * train)
    return passes


# ---- the rollout -----------------------------------------------------------------------

def weight_bytes(shape) -> float:
    """The bf16 copy the engine decodes from (every weight, as decode.py's GB/s counts it)."""
    embeddings = shape.hidden_size * shape.vocab_size * (1 if shape.tie_word_embeddings else 2)
    return 2.0 * (flop_model.matmul_weights(shape) + embeddings)


def kv_bytes(shape) -> int:
    """A cached position's keys and values, every layer, bf16."""
    return 2 * 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim


def slot_groups(s: Setup) -> int:
    """The engine's slot groups (models/sharding.py ROLLOUT_RULES): slots, their KV cache and
    prefill rows split over data x fsdp, and over tensor too where it cannot split the KV
    heads (attention data-parallel)."""
    a = s.axes
    return a["data"] * a["fsdp"] * (1 if s.shape.num_kv_heads % a["tensor"] == 0 else a["tensor"])


def split_rows(rows: int, a: dict[str, int]) -> int:
    """How many ways a prefill of `rows` rows splits: the longest leading run of the slot
    axes (data, fsdp) whose product divides it (models/sharding.py partition_spec)."""
    ways = 1
    for axis in ("data", "fsdp"):
        if a[axis] > 1:
            if rows % (ways * a[axis]):
                break
            ways *= a[axis]
    return ways


def prefill_calls(s: Setup, prompts: np.ndarray) -> list[tuple[int, int, int]]:
    """The prefill calls of one turn's prompts [P], in order, prefill_rows a call (the
    scheduler prefills whole calls, the prompts waiting next ahead of their slots,
    engine/scheduler.py): (prompts, rows compiled, bucket), the bucket the longest prompt's,
    the rows the next compiled count."""
    rows, buckets = s.config.engine.prefill_rows, np.array(s.buckets)
    counts = s.config.engine.row_counts()
    calls = []
    for start in range(0, len(prompts), rows):
        call = prompts[start:start + rows]
        calls.append((len(call), next(c for c in counts if c >= len(call)),
                      int(buckets[np.searchsorted(buckets, call.max())])))
    return calls


def rollout_turns(s: Setup) -> list[dict]:
    """Per turn of a trajectory (update 1, 2, ..., final): rows, mean prompt and response,
    prefill FLOPs and seconds, the bytes a chip receives of other groups' prefixes, decode
    tokens, KV bytes a chip reads (the engine's cache length, each slot's filled length, the
    whole max_len), decode seconds for each."""
    config, rows, shape, a = s.config, s.rows, s.shape, s.axes
    n, slots = config.rollout.n, config.engine.slots
    groups, chips = slot_groups(s), s.chips
    weights_per_token = weight_bytes(shape) / a["tensor"] / slots  # a step's weights, per slot
    out = []
    for label, where in ([(f"update {k + 1}", (~rows.final) & (rows.turn == k))
                          for k in range(int(rows.turn[~rows.final].max()) + 1)]
                         + [("final", rows.final)]):
        prompt, response = rows.prompt[where], rows.response[where].astype(float)
        # A group's first prompt, prefilled once for its n samples.
        prefilled = prompt[::n] if label == "update 1" else prompt
        calls = prefill_calls(s, prefilled)
        prefill = sum(compiled * flop_model.forward(shape, flop_model.row(bucket, 1))
                      for _, compiled, bucket in calls)
        prefill_s = sum(compiled * flop_model.forward(shape, flop_model.row(bucket, 1))
                        / (split_rows(compiled, a) * a["tensor"] * s.chip.prefill.value)
                        for _, compiled, bucket in calls)
        # Every prefix is held whole by each slot group, so an insert reads it where its slot
        # lives: a chip receives the other groups' rows.
        gathered = sum(real * bucket for real, _, bucket in calls) * kv_bytes(shape) * (
            1 - 1 / groups) / chips * groups
        filled = (response * prompt + response * (response + 1) / 2).sum()  # positions read
        kv = response.sum() * s.cache_length * kv_bytes(shape) / chips
        ragged = filled * kv_bytes(shape) / chips
        whole = response.sum() * s.max_len * kv_bytes(shape) / chips
        weights = response.sum() * weights_per_token
        out.append({"turn": label, "rows": int(where.sum()), "prompt": prompt.mean(),
                    "response": response.mean(), "prefill_flops": prefill,
                    "prefill_s": prefill_s, "gathered": gathered,
                    "tokens": response.sum(), "kv": kv, "whole": whole, "weights": weights,
                    "decode_s": (weights + kv) / s.chip.decode.value,
                    "decode_ragged_s": (weights + ragged) / s.chip.decode.value,
                    "decode_whole_s": (weights + whole) / s.chip.decode.value})
    return out


def decode_compute_s(s: Setup) -> float:
    """The decode's FLOPs a chip computes, at the prefill rate: a check that decode is
    bandwidth-bound."""
    rows, shape = s.rows, s.shape
    response, prompt = rows.response.astype(float), rows.prompt
    tokens = response.sum()
    filled = (response * prompt + response * (response + 1) / 2).sum()
    flops = (flop_model.forward(shape, flop_model.Work(tokens, 0, tokens)) / s.chips
             + flop_model.layers_forward(shape, flop_model.Work(0, filled, 0)) / s.chips)
    return flops / s.chip.prefill.value


# ---- the report ------------------------------------------------------------------------

def report(s: Setup, title: str) -> str:
    """The projection as text: the inputs and rates, the rollout by turn, the update by pass
    and token count, the step, and the original's figure beside it."""
    config, rows, shape, a, chip = s.config, s.rows, s.shape, s.axes, s.chip
    trajectories = config.prompts_per_step * config.rollout.n
    lines = []
    say = lines.append
    say(f"# {title}: {s.chips} x {chip.name}, mesh data {a['data']} x fsdp {a['fsdp']} x "
        f"tensor {a['tensor']}")
    say(f"model: {shape.num_layers} layers, hidden {shape.hidden_size}, {shape.num_heads}/"
        f"{shape.num_kv_heads} heads; N = {flop_model.matmul_weights(shape) / 1e9:.2f}e9 layer "
        f"matmul weights, LM head {shape.hidden_size * shape.vocab_size / 1e9:.2f}e9; bf16 copy "
        f"{weight_bytes(shape) / 1e9:.2f} GB; KV {kv_bytes(shape) / 1024:.0f} KiB a position")
    say(f"batch: {config.prompts_per_step} prompts x n {config.rollout.n} = {trajectories} "
        f"trajectories, {len(rows.prompt)} turns ({len(rows.prompt) / trajectories:.2f} a "
        f"document: up to {config.memagent.max_chunks} chunks of {config.memagent.chunk_tokens} "
        f"tokens, then the final turn)")
    say(f"  assumed rows: {memagent_rows.describe()}")
    say("rates a chip:")
    say(f"  update  {chip.train.value / 1e12:7.1f} TFLOP/s  {chip.train.source}")
    say(f"  prefill {chip.prefill.value / 1e12:7.1f} TFLOP/s  {chip.prefill.source}")
    say(f"  decode  {chip.decode.value / 1e9:7.0f} GB/s     {chip.decode.source}")
    say("")
    rollout_s = _rollout(s, lines)
    lines.append("")
    update = _update(s, lines)
    lines.append("")
    lines.append("step: " + "; ".join(
        f"{rollout_s + sum(p.values()):.0f} s with {name} tokens (rollout {rollout_s:.0f} + "
        f"update {sum(p.values()):.0f})" for name, p in update.items()) + f" on {s.chips} chips")
    _original(s, rollout_s, update, lines)
    return "\n".join(lines)


def _rollout(s: Setup, lines: list[str]) -> float:
    """Appends the rollout's lines; returns its seconds."""
    config, shape, a, chip = s.config, s.shape, s.axes, s.chip
    slots, rows, groups = config.engine.slots, config.engine.prefill_rows, slot_groups(s)
    turns = rollout_turns(s)
    copy = weight_bytes(shape) / a["tensor"]
    place_s = copy * (1 - 1 / a["fsdp"]) / chip.link.value
    say = lines.append
    say(f"rollout (the engine's layout, models/sharding.py ROLLOUT_RULES): engine.slots {slots} "
        f"over {groups} slot groups ({slots // groups} each), their KV cache split over all "
        f"{s.chips} chips (held once); the bf16 weights split over tensor ({a['tensor']}) only, "
        f"{copy / 1e9:.2f} GB a chip; max_len {s.max_len}; prefill_rows {rows}")
    say(f"  assumed: slots always full (continuous batching over {len(s.rows.prompt)} turns, "
        f"prompts prefilled ahead of their slots); a call's rows split over the slot groups "
        f"their count divides, padded to the "
        f"longest prompt's bucket, each prefix then gathered by every group; insert, sampling "
        f"and host time not counted; the engine's KV cache {s.cache_length} long (the cache "
        f"length holding the longest turn) on every decode step")
    say(f"  {'turn':10s} {'rows':>6s} {'prompt':>7s} {'reply':>6s} {'prefill TFLOP':>14s} "
        f"{'prefill s':>10s} {'decode tokens':>14s} {'KV TB a chip':>13s} {'decode s':>9s}")
    total = {"turn": "total", "rows": len(s.rows.prompt), **{k: sum(t[k] for t in turns) for k in (
        "prefill_flops", "prefill_s", "gathered", "tokens", "kv", "weights", "decode_s",
        "decode_ragged_s", "decode_whole_s")}}
    for t in turns + [total]:
        mean = (f"{t['prompt']:7.0f} {t['response']:6.0f}" if "prompt" in t else " " * 14)
        say(f"  {t['turn']:10s} {t['rows']:6d} {mean} "
            f"{t['prefill_flops'] / 1e12:14.0f} {t['prefill_s']:10.1f} {t['tokens']:14.0f} "
            f"{t['kv'] / 1e12:13.1f} {t['decode_s']:9.1f}")
    steps = total["tokens"] / slots
    decode_s = total["decode_s"]
    gather_s = total["gathered"] / chip.link.value
    say(f"  decode: {steps:.0f} steps of {decode_s / steps * 1e3:.1f} ms (a chip reads "
        f"{copy / 1e9:.2f} GB of weights a step and {total['kv'] / steps / 1e9:.2f} GB of KV); "
        f"each slot reading only its own filled length (a ragged kernel; the CPU engine's "
        f"read): {total['decode_ragged_s']:.1f} s; every slot's whole max_len "
        f"cache: {total['decode_whole_s']:.1f} s; the decode's FLOPs at the "
        f"prefill rate: {decode_compute_s(s):.1f} s (bandwidth-bound)")
    say(f"  over the interconnect ({chip.link.value / 1e9:.0f} GB/s a chip: {chip.link.source}): "
        f"the prefixes each chip gathers, {total['gathered'] / 1e12:.2f} TB, {gather_s:.1f} s; "
        f"the engine's copy made from the learner's fsdp x tensor shards, "
        f"{copy * (1 - 1 / a['fsdp']) / 1e9:.2f} GB a chip, {place_s:.2f} s a rollout")
    rollout_s = total["prefill_s"] + decode_s + gather_s + place_s
    say(f"  rollout: {rollout_s:.0f} s (prefill {total['prefill_s']:.0f} + decode "
        f"{decode_s:.0f} + interconnect {gather_s + place_s:.0f})")
    return rollout_s


def _update(s: Setup, lines: list[str]) -> dict[str, dict[str, float]]:
    """Appends the update's lines; returns {token count: {pass: seconds}}."""
    learner, chip = s.config.learner, s.chip
    say = lines.append
    say(f"update: all {s.chips} chips at the update rate (rows over data x fsdp, weights over "
        f"fsdp x tensor; assumed: FSDP's gathers hidden behind the matmuls); remat "
        f"{learner.remat}, {learner.mini_batches} mini-batches x {learner.ppo_epochs} epoch(s), "
        f"micro-batches of {learner.micro_batch_tokens} tokens, buckets "
        f"{list(learner.bucket_lengths or [])}, kl_coef {learner.kl_coef}")
    if learner.old_logprobs == "rollout":
        say("  old log-probs: the engine's (learner.old_logprobs: rollout), no forward pass")
    counts = {name: update_passes(s, count) for name, count in TOKEN_COUNTS.items()}
    seconds = {name: {p: f / s.chips / chip.train.value for p, (_, f) in v.items()}
               for name, v in counts.items()}
    say(f"  {'pass':28s}" + "".join(f" {name + ': tokens':>16s} {'PFLOP':>8s} {'s':>7s}"
                                      for name in counts))
    for p in next(iter(counts.values())):
        say(f"  {p:28s}" + "".join(f" {counts[n][p][0]:16.0f} {counts[n][p][1] / 1e15:8.1f} "
                                   f"{seconds[n][p]:7.0f}" for n in counts))
    say(f"  {'total':28s}" + "".join(
        f" {sum(t for t, _ in v.values()):16.0f} {sum(f for _, f in v.values()) / 1e15:8.1f} "
        f"{sum(seconds[n].values()):7.0f}" for n, v in counts.items()))
    first = next(iter(counts))
    say("  " + ", ".join(f"{n} / {first} FLOPs: "
                         f"{sum(seconds[n].values()) / sum(seconds[first].values()):.3f}"
                         for n in list(counts)[1:]))
    return seconds


def _original(s: Setup, rollout_s: float, update: dict, lines: list[str]) -> None:
    """Appends #31's figure and ours beside it."""
    o, chip, say = ORIGINAL, s.chip, lines.append
    chip_s = o["chips"] * o["step_s"]
    rest = o["step_s"] - o["update_s"]
    say(f"original (BytedTsinghua-SIA/MemAgent #31): ~{o['step_s']:.0f} s a step, "
        f"~{o['update_s']:.0f} s of it the actor update, on {o['chips']} H100 (4 nodes of 8; "
        f"train batch 128, mini-batch 8, rollout n 16; verl): {chip_s:,.0f} H100-seconds a step; "
        f"at {s.chips} chips, scaled linearly: {chip_s / s.chips:,.0f} s a step, update_actor "
        f"{o['update_s'] * o['chips'] / s.chips:,.0f} s, the rest "
        f"{rest * o['chips'] / s.chips:,.0f} s (H100 seconds)")
    if chip is not CHIPS["h100"]:
        say(f"  {chip.name} at the update rate assumed here: "
            f"{chip.train.value / CHIPS['h100'].train.value:.2f}x an H100's measured one")
    train = "train (forward + backward)"
    for name, passes in update.items():
        step = rollout_s + sum(passes.values())
        say(f"  ours, {name}: {step * s.chips:,.0f} chip-seconds a step "
            f"({step * s.chips / chip_s:.2f} of #31's); the forward and backward "
            f"{passes[train]:,.0f} s (#31's update_actor, "
            f"scaled: {o['update_s'] * o['chips'] / s.chips:,.0f}), the rollout and both "
            f"log-prob passes {step - passes[train]:,.0f} s (#31's rest, scaled: "
            f"{rest * o['chips'] / s.chips:,.0f})")
    if s.config.learner.lora is not None:
        lora = s.config.learner.lora
        say(f"  LoRA (rank {lora.rank}, {', '.join(lora.targets)}): the forward and backward "
            "through the merged weights as the learner runs it; beside it, the same step")
        for trained in TRAINED[1:]:
            steps = []
            for name, count in TOKEN_COUNTS.items():
                passes = update_passes(s, count, trained)
                step = rollout_s + sum(f for _, f in passes.values()) / s.chips / chip.train.value
                steps.append(f"{name} {step * s.chips:,.0f} ({step * s.chips / chip_s:.2f})")
            ratio = update_passes(s, real, trained)[train][1] / update_passes(s, real)[train][1]
            say(f"    {trained}: chip-seconds a step (of #31's): {', '.join(steps)}; its "
                f"forward and backward {ratio:.3f} x the merged LoRA's FLOPs")
    flops = update_passes(s, real)[train][1]
    say(f"  #31's update_actor at our forward-and-backward FLOPs (real tokens, remat included): "
        f"{flops / (o['update_s'] * o['chips']) / 1e12:.0f} TFLOP/s a GPU, "
        f"{flops / (o['update_s'] * o['chips']) / 989e12:.1%} of the H100's 989 TFLOP/s bf16 "
        "peak")
    link = "NVLink" if chip is CHIPS["h100"] else "the slice's ICI"
    say("  differs: verl times its old-log-prob and reference passes apart from update_actor "
        "(they sit in #31's rest with the rollout); #31 does not state its documents' lengths "
        "or micro-batch settings (ours: the rows assumed above); its 4 nodes talk over the "
        f"network where our {s.chips} chips share {link}; linear scaling to another chip count "
        "is an assumption")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--chip", choices=sorted(CHIPS),
                        help="the target (default: from model.attention, "
                             f"{', '.join(f'{k}: {v}' for k, v in TARGETS.items())})")
    parser.add_argument("--preset", default=None,
                        help="the model shape, when model.path is not on this machine (default: "
                             "the preset model.path's last component names, else qwen2.5-7b)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)
    try:
        s = setup(load_train_config(args.config, args.overrides), args.chip, args.preset)
        print(report(s, " ".join([args.config] + args.overrides)))
    except UserError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
