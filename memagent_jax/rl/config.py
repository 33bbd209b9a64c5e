"""The training run's config schema (`memagent-jax train --config FILE key=value ...`).

Sections, each a dataclass read by `runconfig.load_config` (unknown keys and wrong types are
errors naming the key):
    model       which weights: an HF/checkpoint directory, or a preset with random weights
    mesh        device mesh axis sizes (data, fsdp, tensor; -1 takes the remaining devices)
    data        training source(s) in the hotpotqa parquet layout, validation source, verifier
    rollout     decode slots and KV length, MemAgent budgets, n samples per prompt, sampling
    dynamic_sampling, overlong   DAPO's batch filter and soft length penalty
    learner     `rl.learner.LearnerConfig` as it is (optimizer, PPO clipping, KL, micro-batches)
    validation  every N steps, on the first `size` rows of data.val, lenient metrics
    checkpoint  Orbax directory, every N steps, keep the last N
plus steps, prompts_per_step, seed, output_dir, log_dir, distributed, compilation_cache_dir.

`validate(config)` checks everything that needs no device; `check_devices(config, devices,
processes)` checks the mesh against the machine (e.g. the batch must split over the mesh's
data-parallel axes). Both raise `UserError` and run before any model is loaded.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Literal

from memagent_jax.errors import UserError
from memagent_jax.rl.learner import LearnerConfig
from memagent_jax.runconfig import load_config


@dataclasses.dataclass
class ModelSection:
    """path: HF directory or memagent-jax checkpoint. preset: random weights of a preset shape
    instead (for smoke runs; needs `tokenizer`). tokenizer: directory with tokenizer files
    (default: path). dtype: None = float32 on CPU, bfloat16 on accelerators."""
    path: str | None = None
    preset: str | None = None
    tokenizer: str | None = None
    dtype: Literal["float32", "bfloat16"] | None = None
    attention: str = "xla"  # models.qwen2.ATTENTION_IMPLEMENTATIONS: prefill and training
    init_seed: int = 0


@dataclasses.dataclass
class DataSection:
    """train: sources whose rows are concatenated (files, directories, hf:// paths, hub ids).
    reward: 'by_source' looks the verifier up by each row's data_source (rl.rewards); 'strict'
    forces the strict verifier; 'contains' scores 1 when a gold answer appears as a phrase in
    the final reply (a gentler signal for smoke runs with untrained tiny models)."""
    train: list[str] = dataclasses.field(default_factory=list)
    train_split: str = "train"
    val: str | None = None
    val_split: str = "train"
    reward: Literal["by_source", "strict", "contains"] = "by_source"


@dataclasses.dataclass
class RolloutSection:
    """slots: sequences decoded together; max_len: KV entries per slot (None: the longest turn
    the budgets allow, rounded up to 256); prefill_buckets: prompt lengths compiled for
    (None: the engine's default buckets); prefill_rows: prompts prefilled together in one call.
    n: trajectories per prompt (a group)."""
    slots: int = 64
    max_len: int | None = None
    prefill_buckets: list[int] | None = None
    prefill_rows: int = 1
    chunk_tokens: int = 5000
    max_memory_tokens: int = 1024
    max_final_tokens: int = 1024
    max_problem_tokens: int = 1024
    max_chunks: int | None = 8
    n: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


@dataclasses.dataclass
class DynamicSamplingSection:
    """DAPO: drop groups whose rewards are all equal and sample more prompts until
    prompts_per_step groups are kept, at most max_tries rollout rounds per step (then train on
    what was kept; a step that kept nothing makes no update)."""
    enabled: bool = True
    max_tries: int = 4


@dataclasses.dataclass
class OverlongSection:
    """DAPO's soft overlong penalty, added to the trajectory's reward: each conversation is
    judged against its own cap (memory or final tokens); the trajectory gets its worst one."""
    enabled: bool = False
    buffer: int = 256
    penalty_factor: float = 1.0


@dataclasses.dataclass
class ValidationSection:
    """every: steps between validations (0: never); size: first rows of data.val used.
    Sampled as the published RULER-HQA accuracy was (temperature 0.7, top_p 0.95)."""
    every: int = 0
    size: int = 128
    temperature: float = 0.7
    top_p: float = 0.95
    at_start: bool = False


@dataclasses.dataclass
class CheckpointSection:
    """dir: None = {output_dir}/checkpoints; every: steps between saves (0: only the last
    step); keep: newest checkpoints kept; async_save: write in the background."""
    dir: str | None = None
    every: int = 10
    keep: int = 3
    async_save: bool = True


@dataclasses.dataclass
class TrainConfig:
    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    mesh: dict[str, int] = dataclasses.field(
        default_factory=lambda: {"data": 1, "fsdp": -1, "tensor": 1})
    data: DataSection = dataclasses.field(default_factory=DataSection)
    rollout: RolloutSection = dataclasses.field(default_factory=RolloutSection)
    dynamic_sampling: DynamicSamplingSection = dataclasses.field(
        default_factory=DynamicSamplingSection)
    overlong: OverlongSection = dataclasses.field(default_factory=OverlongSection)
    learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
    validation: ValidationSection = dataclasses.field(default_factory=ValidationSection)
    checkpoint: CheckpointSection = dataclasses.field(default_factory=CheckpointSection)
    steps: int = 200
    prompts_per_step: int = 128
    seed: int = 0
    output_dir: str = "runs/memagent"
    log_dir: str | None = None  # None: {output_dir}/logs (TensorBoard events, steps.jsonl)
    distributed: bool = False   # jax.distributed.initialize() (multi-host) before anything
    # JAX's persistent compilation cache: a restarted or resumed run (a preempted pod slice)
    # loads its compiled programs instead of compiling them again. None: off.
    compilation_cache_dir: str | None = None

    @property
    def checkpoint_dir(self) -> str:
        return self.checkpoint.dir or os.path.join(self.output_dir, "checkpoints")

    @property
    def logs_dir(self) -> str:
        return self.log_dir or os.path.join(self.output_dir, "logs")


def load_train_config(path: str | None, overrides: list[str] = ()) -> TrainConfig:
    """The config from YAML + overrides, validated (no device is touched)."""
    config = _expand_user(load_config(TrainConfig, path, list(overrides)))
    validate(config)
    return config


def _expand_user(config: TrainConfig) -> TrainConfig:
    """`~` in local paths -> the home directory (YAML does not expand it; hf:// and hub ids
    never start with it)."""
    expand = os.path.expanduser
    opt = lambda p: None if p is None else expand(p)  # noqa: E731
    return dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, path=opt(config.model.path),
                                  tokenizer=opt(config.model.tokenizer)),
        data=dataclasses.replace(config.data, train=[expand(s) for s in config.data.train],
                                 val=opt(config.data.val)),
        checkpoint=dataclasses.replace(config.checkpoint, dir=opt(config.checkpoint.dir)),
        output_dir=expand(config.output_dir), log_dir=opt(config.log_dir),
        compilation_cache_dir=opt(config.compilation_cache_dir))


def validate(config: TrainConfig) -> None:
    """Every check that needs neither devices nor files; raises UserError naming the key."""
    model, rollout = config.model, config.rollout
    if (model.path is None) == (model.preset is None):
        raise UserError("model: give exactly one of model.path (weights) and model.preset "
                        "(random weights)")
    from memagent_jax.models.qwen2 import ATTENTION_IMPLEMENTATIONS
    if model.attention not in ATTENTION_IMPLEMENTATIONS:
        raise UserError(f"model.attention: must be one of {', '.join(ATTENTION_IMPLEMENTATIONS)}"
                        f", got {model.attention!r}")
    if model.preset is not None and model.tokenizer is None:
        raise UserError("model.tokenizer: a preset model needs a tokenizer directory")
    if not config.data.train:
        raise UserError("data.train: no training source given")
    _positive(config, "steps", "prompts_per_step", "rollout.slots", "rollout.prefill_rows",
              "rollout.chunk_tokens", "rollout.max_memory_tokens", "rollout.max_final_tokens",
              "rollout.max_problem_tokens", "rollout.n", "dynamic_sampling.max_tries",
              "checkpoint.keep", "validation.size")
    if rollout.max_chunks is not None and rollout.max_chunks < 1:
        raise UserError(f"rollout.max_chunks: must be positive or null, got {rollout.max_chunks}")
    if rollout.max_len is not None and rollout.max_len < 2:
        raise UserError(f"rollout.max_len: must be at least 2, got {rollout.max_len}")
    if not rollout.temperature > 0:
        raise UserError(f"rollout.temperature: must be > 0 for training samples, got "
                        f"{rollout.temperature}")
    for key in ("rollout.top_p", "validation.top_p"):
        value = _get(config, key)
        if not 0 < value <= 1:
            raise UserError(f"{key}: must be in (0, 1], got {value}")
    if config.validation.temperature < 0:
        raise UserError("validation.temperature: must be >= 0 (0 is greedy)")
    if config.overlong.enabled:
        cap = min(rollout.max_memory_tokens, rollout.max_final_tokens)
        if not 1 <= config.overlong.buffer <= cap:
            raise UserError(f"overlong.buffer: must be in 1..{cap} (the smaller reply cap), "
                            f"got {config.overlong.buffer}")
    for key in ("validation.every", "checkpoint.every"):
        if _get(config, key) < 0:
            raise UserError(f"{key}: must be >= 0, got {_get(config, key)}")
    if (config.validation.every or config.validation.at_start) and not config.data.val:
        raise UserError("data.val: validation is on (validation.every / at_start) but no "
                        "validation source is given")
    for axis, size in config.mesh.items():
        if not isinstance(size, int) or (size < 1 and size != -1):
            raise UserError(f"mesh.{axis}: size must be a positive integer or -1, got {size!r}")


def check_devices(config: TrainConfig, device_count: int, process_count: int = 1) -> dict:
    """The mesh's axis sizes on this machine; raises UserError when the config's batches do not
    split over it: prompts over processes, the learner's micro-batch rows over the
    data-parallel axes (data x fsdp), decode slots over data."""
    from memagent_jax.models.sharding import DEFAULT_MESH, MESH_AXES

    axes = {**{a: 1 for a in MESH_AXES}, **(config.mesh or DEFAULT_MESH)}
    unknown = [a for a in axes if a not in MESH_AXES]
    if unknown:
        raise UserError(f"mesh: unknown axis '{unknown[0]}' (known: {', '.join(MESH_AXES)})")
    free = [a for a, s in axes.items() if s == -1]
    if len(free) > 1:
        raise UserError(f"mesh: only one axis may be -1, got {', '.join(free)}")
    fixed = math.prod(s for s in axes.values() if s != -1)
    if free:
        if device_count % fixed:
            raise UserError(f"mesh: {device_count} devices do not divide by {fixed}")
        axes[free[0]] = device_count // fixed
    if math.prod(axes.values()) != device_count:
        raise UserError(f"mesh: axis sizes {axes} need {math.prod(axes.values())} devices, "
                        f"found {device_count}")
    if config.prompts_per_step % process_count:
        raise UserError(f"prompts_per_step: {config.prompts_per_step} prompts do not split "
                        f"over {process_count} processes")
    data_parallel = axes["data"] * axes["fsdp"]
    rows = _micro_batch_rows(config.learner)
    if rows is not None and rows % data_parallel:
        raise UserError(f"learner: a micro-batch of {rows} rows does not split over the mesh's "
                        f"data-parallel axes (data x fsdp = {data_parallel}); use a multiple "
                        f"of {data_parallel}")
    if config.rollout.slots % axes["data"]:
        raise UserError(f"rollout.slots: {config.rollout.slots} decode slots do not split over "
                        f"mesh.data = {axes['data']}")
    return axes


def _micro_batch_rows(learner: LearnerConfig) -> int | None:
    """The learner's fixed rows per micro-batch, if it has such a setting."""
    for name in ("micro_batch_rows", "micro_batch_size", "micro_batch"):
        value = getattr(learner, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _get(config, key: str):
    value = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _positive(config, *keys: str) -> None:
    for key in keys:
        value = _get(config, key)
        if value < 1:
            raise UserError(f"{key}: must be positive, got {value}")
