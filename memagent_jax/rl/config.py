"""The training run's config schema (`memagent-jax train --config FILE key=value ...`).

Plain data: loading a config imports no agent, plugin, model code, JAX or runner. The trainer
builds what its `agent`, `plugin` and `learner.loss` name in a step of its own (rl/build.py),
whose checks name the key as these do.

Sections, each a dataclass read by `runconfig.load_config` (unknown keys and wrong types are
errors naming the key), each checking its own values as it is built:
    model       which weights: an HF/checkpoint directory, or a preset with random weights
                (`engine.model_section.ModelSection`, shared with eval)
    mesh        device mesh axis sizes (data, fsdp, tensor; -1 takes the remaining devices)
    agent       the agent a step rolls out: its module and its own keys (rollout/agent_api.py;
                none: MemAgent)
    data        training source(s) in verl's layout, validation source
    reward      the function that scores a trajectory's final reply, its process pool
                (`scoring.RewardSection`)
    memagent    MemAgent's token budgets and `thinking` (`MemAgentConfig`, shared with eval
                and `run`)
    engine      decode slots, KV length, prefill buckets (`EngineConfig`, shared likewise)
    rollout     n samples per prompt and how they are sampled
    dynamic_sampling, overlong   DAPO's batch filter and soft length penalty
    learner     `LearnerConfig` (optimizer, PPO clipping, KL, micro-batches: rl/learner.py,
                rl/batching.py)
    validation  every N steps, on the first `size` rows of data.val, lenient metrics
    checkpoint  Orbax directory, every N steps, keep the last N
    log         what the logs keep beyond each step's line (rollouts.jsonl)
    plugin      an experiment's module and its own keys (rl/plugin.py; {}: none)
plus steps, prompts_per_step, seed, output_dir, log_dir, distributed, compilation_cache_dir.

`TrainConfig`'s own check covers what spans sections; `check_devices(config, devices)` checks
the batches against the mesh over the job's devices. What the agent and plugin check of the
rest (their sections' keys, the overlong buffer against the agent's reply caps) is checked as
they are built (rl/build.py), and files (data, model, tokenizer) by the trainer, still before
any model is loaded.

A run keeps its resolved config in `output_dir/config.yaml` (`CONFIG_FILE`); resuming from a
checkpoint, it may change only the keys in `RESUMABLE`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from memagent_jax.agents.memagent.config import MemAgentConfig
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.model_section import ModelSection
from memagent_jax.errors import ConfigError
from memagent_jax.models.config import Remat
from memagent_jax.models.lora_config import LoraConfig
from memagent_jax.models.mesh_axes import DEFAULT_MESH, resolve_axes
from memagent_jax.rl.scoring import RewardSection
from memagent_jax.runconfig import at_least, load_config, probability

CONFIG_FILE = "config.yaml"  # the run's resolved config, in its output_dir

# What a run resumed from its checkpoint may change (the trainer refuses any other change,
# naming it): how long it runs and how often it checkpoints and validates (neither changes a
# step: the learning-rate schedule has its own learner.total_steps, validation its own seed),
# the run directory's name, and how the job sits on its machines: the mesh (a job resumes on
# any number of processes) and the memory settings that follow it (slots over mesh.data,
# micro-batches over data x fsdp), which change how a step is computed, not what.
RESUMABLE = ("steps", "checkpoint.every", "checkpoint.keep", "checkpoint.async_save",
             "validation.every", "validation.at_start", "output_dir", "mesh", "distributed",
             "compilation_cache_dir", "engine.slots", "learner.micro_batch_tokens",
             "learner.remat", "log")


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """The `learner` section of the train config. Defaults are the original's
    (docs/algorithm.md section 3) except mini_batches and loss_agg."""
    SECTION: ClassVar[str] = "learner"
    # The names transformers' TrainingArguments and verl's actor give keys of this section,
    # unlike ours (an unknown key's hint: `runconfig._unknown_key`).
    SYNONYMS: ClassVar[dict[str, str]] = {
        "learning_rate": "lr", "grad_clip": "max_grad_norm", "clip_ratio_low": "eps_low",
        "clip_ratio_high": "eps_high", "gradient_checkpointing": "remat"}
    # Keys this section had, each with the value it now always has (an older run's saved
    # config.yaml, which lists every key with that value, still loads; another is an error).
    REMOVED: ClassVar[dict[str, tuple[Any, str]]] = {
        "micro_batch_rows": (None, "micro-batches are sized by learner.micro_batch_tokens "
                                   "(rows x their bucket length)"),
        "credit": ("broadcast", "every trained turn carries its trajectory's whole "
                                "advantage (credit: broadcast, the original's)"),
        "train_final_turn": (True, "the final-answer turns are always trained (the "
                                   "original's)"),
        "seed": (0, "the mini-batch shuffle is seeded by the top-level seed")}
    lr: float = 1e-6                    # peak learning rate (AdamW)
    warmup_steps: int = 20              # linear warm-up in training steps; step 0 runs at lr 0
    lr_schedule: str = "constant"       # after the warm-up: "constant" or "cosine"
    total_steps: int | None = None      # where cosine reaches lr * min_lr_ratio (then stays)
    min_lr_ratio: float = 0.0           # cosine's floor, a fraction of lr
    weight_decay: float = 0.01          # AdamW's decoupled weight decay
    adam_b1: float = 0.9                # AdamW's first-moment decay
    adam_b2: float = 0.999              # AdamW's second-moment decay
    adam_eps: float = 1e-8              # AdamW's denominator epsilon
    max_grad_norm: float = 1.0          # global gradient-norm clip
    eps_low: float = 0.2                # PPO ratio clip below: 1 - eps_low
    eps_high: float = 0.2               # PPO ratio clip above: 1 + eps_high (DAPO's: 0.28)
    dual_clip: float | None = 3.0       # dual-clip bound for negative advantages (null: off)
    kl_coef: float = 0.001              # low_var_kl to the initial policy (0: no reference)
    entropy_coef: float = 0.0           # entropy bonus (0: entropy is a metric only)
    temperature: float = 1.0            # log-probs of logits / temperature: the rollout's
    mini_batches: int = 1               # optimiser updates per rollout batch and epoch
    micro_batch_tokens: int = 8192      # padded tokens per micro-batch
    pack: bool = True                   # several rows per sequence, segment ids (2)
    ppo_epochs: int = 1                 # passes over the rollout batch
    remat: Remat = "none"               # what the backward keeps: none/matmuls/full (3)
    logit_chunk_tokens: int | None = 1024   # LM-head positions at once (null: all; logprobs.py)
    old_logprobs: str = "recompute"     # "recompute" before the first update, or "rollout"
    rollout_correction: float | None = None  # TIS cap C: pg loss x min(p_old/p_rollout, C)
    normalize_std: bool = False         # divide advantages by the group's std (the trainer)
    loss_agg: Literal["global_token_mean", "per_rank_token_mean"] = "global_token_mean"  # (1)
    loss_agg_ranks: int | None = None   # ranks for per_rank_token_mean (null: data x fsdp)
    bucket_lengths: tuple[int, ...] | None = None  # padded row lengths (null: powers of two)
    loss: Literal["dapo", "sft"] = "dapo"   # clipped policy loss, or supervised NLL (rl/plugin.py)
    lora: LoraConfig | None = None      # train LoRA adapters on a frozen base (null: every weight)
    # (1) global_token_mean: every response token of a mini-batch weighs the same, whatever
    # the mesh; per_rank_token_mean: verl's token mean per data-parallel rank, averaged over
    # ranks (docs/algorithm.md section 3).
    # (2) rl/batching.py: the values of one row per sequence on less padding (MemAgent's rows
    # at the 7B plan: 18% of the slots padded -> 13%; BENCHMARKS.md, "Packed learner rows").
    # Under attention cudnn the packed rows attend through jax's Triton flash kernel, which
    # takes segment ids (models/flash_gpu.py).
    # (3) models/qwen.py REMAT_POLICIES: "full" keeps each layer's input only, "matmuls" also
    # its projections' outputs (less recompute, more memory), "none" everything; a config
    # takes the least recompute its compiled train step fits with (benchmarks/aot.py).

    def __post_init__(self):
        def fail(name, message):
            raise ConfigError(f"learner.{name}", f"{message}, got {getattr(self, name)!r}")

        at_least(self, 0, "warmup_steps")
        at_least(self, 1, "mini_batches", "ppo_epochs", "micro_batch_tokens", "loss_agg_ranks",
                 "logit_chunk_tokens")
        for key in ("lr", "max_grad_norm", "temperature"):
            if not getattr(self, key) > 0:
                fail(key, "must be positive")
        if self.lr_schedule not in ("constant", "cosine"):
            fail("lr_schedule", "must be 'constant' or 'cosine'")
        if self.lr_schedule == "cosine" and not (self.total_steps and
                                                 self.total_steps > self.warmup_steps):
            fail("total_steps", "the cosine schedule needs total_steps > warmup_steps")
        if not 0 < self.eps_low < 1 or self.eps_high <= 0:
            fail("eps_low" if not 0 < self.eps_low < 1 else "eps_high", "out of range")
        if self.dual_clip is not None and self.dual_clip <= 1:
            fail("dual_clip", "must be > 1 (or null to switch it off)")
        if self.old_logprobs not in ("recompute", "rollout"):
            fail("old_logprobs", "must be 'recompute' or 'rollout'")
        if self.rollout_correction is not None:
            if not self.rollout_correction > 0:
                fail("rollout_correction", "must be a positive cap (or null to switch it off)")
            if self.old_logprobs == "rollout" or self.loss != "dapo":
                fail("rollout_correction", "needs old_logprobs: recompute and loss: dapo "
                     "(with the rollout's own old log-probs every weight is 1)")
        if self.bucket_lengths is not None and (not self.bucket_lengths
                                                or min(self.bucket_lengths) < 2):
            fail("bucket_lengths", "must be a non-empty list of lengths >= 2")

    def learning_rate(self, step: int) -> float:
        """The learning rate of training step `step` (0-based), for every optimiser update
        of that step."""
        if step < self.warmup_steps:
            return self.lr * step / self.warmup_steps
        if self.lr_schedule == "constant":
            return self.lr
        assert self.total_steps is not None  # the cosine schedule's (`__post_init__`)
        # Clipped: verl's cosine rises again past total_steps.
        progress = min(1.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps))
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 *
                          (1 + math.cos(math.pi * progress)))


@dataclasses.dataclass
class DataSection:
    """Training and validation data, rows in verl's layout (data/pipeline.py)."""
    # Sources whose rows are concatenated: files, directories, hf:// paths, hub ids.
    train: list[str] = dataclasses.field(default_factory=list)
    train_split: str = "train"  # the split read from a hub source
    val: str | None = None      # the validation source (None: no validation)
    val_split: str = "train"    # its split
    shuffle: bool = False       # seeded order, reshuffled each epoch (off: the file's order)
    SECTION: ClassVar[str] = "data"
    MOVED: ClassVar[dict[str, str]] = {"reward": "reward.function"}

    def __post_init__(self):
        # `~` in local paths (YAML does not expand it; hf:// and hub ids never start with it).
        self.train = [os.path.expanduser(s) for s in self.train]
        self.val = self.val and os.path.expanduser(self.val)
        if not self.train:
            raise ConfigError("data.train", "no training source given")


@dataclasses.dataclass
class RolloutSection:
    """How training rollouts are sampled."""
    n: int = 16                 # trajectories per prompt (a group)
    temperature: float = 1.0    # sampling temperature (> 0; learner.temperature must equal it)
    top_p: float = 1.0          # nucleus sampling (1: off)
    top_k: int = 0              # top-k sampling (0: off)
    # A rollout still running this many seconds after it started is cancelled, masked from
    # the loss and counted (rollout/timed_out); null: no deadline (rollout/rollouts.py).
    timeout_s: float | None = None
    max_concurrent: int | None = None   # rollouts in flight at once (null: every one)
    SECTION: ClassVar[str] = "rollout"

    def __post_init__(self):
        at_least(self, 1, "n", "max_concurrent")
        at_least(self, 0, "top_k")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ConfigError("rollout.timeout_s", f"must be a positive number of seconds (or "
                                                   f"null: no deadline), got {self.timeout_s}")
        if not self.temperature > 0:
            raise ConfigError("rollout.temperature", f"must be > 0 for training samples, got "
                                                     f"{self.temperature}")
        probability(self, "top_p")


@dataclasses.dataclass
class DynamicSamplingSection:
    """DAPO's filter: drop groups whose rewards are all equal and sample more prompts until
    prompts_per_step groups are kept (then train on what was kept; a step that kept nothing
    makes no update). Off by default, as in the published runs."""
    enabled: bool = False       # the published runs' `filter_groups` was off
    max_tries: int = 4          # rollout rounds per step at most
    SECTION: ClassVar[str] = "dynamic_sampling"

    def __post_init__(self):
        at_least(self, 1, "max_tries")


@dataclasses.dataclass
class OverlongSection:
    """DAPO's soft overlong penalty, added to the trajectory's reward: each turn is judged
    against its own cap (memory or final tokens); the trajectory gets its worst one."""
    enabled: bool = False       # off in the original's scripts
    buffer: int = 256           # tokens below the cap where the penalty starts
    penalty_factor: float = 1.0  # the penalty at the cap


@dataclasses.dataclass
class ValidationSection:
    """Validation through the memory loop, its documents read as training reads them
    (centre-truncated to memagent.max_chunks); defaults are the published training scripts'.
    (The paper's RULER-HQA table was sampled at temperature 0.7, top_p 0.95: `eval`.)"""
    every: int = 0              # steps between validations (0: never)
    size: int = 128             # the first rows of data.val used
    n: int = 4                  # samples per question
    temperature: float = 1.0    # 0 is greedy
    top_p: float = 0.7
    at_start: bool = False      # also validate before the first step
    SECTION: ClassVar[str] = "validation"

    def __post_init__(self):
        at_least(self, 0, "every")
        at_least(self, 1, "size", "n")
        if self.temperature < 0:
            raise ConfigError("validation.temperature", "must be >= 0 (0 is greedy)")
        probability(self, "top_p")


@dataclasses.dataclass
class LogSection:
    """What a run keeps in its logs beyond each step's line (steps.jsonl, TensorBoard)."""
    # Every this many steps, the step's first `rollouts` trajectories as trained (messages,
    # ids, loss mask, behaviour log-probs, reward) in logs/rollouts.jsonl (rl/trained.py);
    # 0: never.
    rollouts_every: int = 10
    rollouts: int = 4
    SECTION: ClassVar[str] = "log"

    def __post_init__(self):
        at_least(self, 0, "rollouts_every")
        at_least(self, 1, "rollouts")


@dataclasses.dataclass
class CheckpointSection:
    """Orbax checkpoints of the whole training state."""
    dir: str | None = None      # None: {output_dir}/checkpoints (gs:// works)
    every: int = 10             # steps between saves (0: only the last step)
    keep: int = 3               # newest checkpoints kept
    async_save: bool = True     # write in the background
    SECTION: ClassVar[str] = "checkpoint"

    def __post_init__(self):
        self.dir = self.dir and os.path.expanduser(self.dir)
        at_least(self, 0, "every")
        at_least(self, 1, "keep")


@dataclasses.dataclass
class TrainConfig:
    COMMAND: ClassVar[str] = "train"
    # Top-level keys of eval configs only: such a file given to train is named as one.
    OTHER_CONFIGS: ClassVar[dict] = {"eval": ("method", "full_context", "sampling", "report")}
    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    mesh: dict[str, int] = dataclasses.field(default_factory=lambda: dict(DEFAULT_MESH))
    # The agent: {module: ..., its own keys} (rollout/agent_api.py); {}: MemAgent.
    agent: dict[str, Any] = dataclasses.field(default_factory=dict)
    data: DataSection = dataclasses.field(default_factory=DataSection)
    reward: RewardSection = dataclasses.field(default_factory=RewardSection)
    # Training documents are centre-truncated to 8 chunks, as the original's were.
    memagent: MemAgentConfig = dataclasses.field(
        default_factory=lambda: MemAgentConfig(max_chunks=8))
    engine: EngineConfig = dataclasses.field(default_factory=lambda: EngineConfig(slots=64))
    rollout: RolloutSection = dataclasses.field(default_factory=RolloutSection)
    dynamic_sampling: DynamicSamplingSection = dataclasses.field(
        default_factory=DynamicSamplingSection)
    overlong: OverlongSection = dataclasses.field(default_factory=OverlongSection)
    learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
    validation: ValidationSection = dataclasses.field(default_factory=ValidationSection)
    checkpoint: CheckpointSection = dataclasses.field(default_factory=CheckpointSection)
    log: LogSection = dataclasses.field(default_factory=LogSection)
    steps: int = 200            # training steps
    prompts_per_step: int = 128  # groups trained on per step
    seed: int = 0               # data order, rollout seeds, the plugin's rows, the learner's
                                # mini-batch shuffle
    output_dir: str = "runs/memagent"
    log_dir: str | None = None  # None: {output_dir}/logs (TensorBoard events, steps.jsonl)
    distributed: bool = False   # jax.distributed.initialize() (multi-host) before anything
    # JAX's persistent compilation cache: a restarted run (a preempted pod slice) loads its
    # compiled programs instead of compiling them again. None: off.
    compilation_cache_dir: str | None = None
    # An experiment's plugin and its own keys (rl/plugin.py); {}: none.
    plugin: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        """The checks that span sections (each section checked its own values already)."""
        if self.learner.lora is not None:
            pass  # the base is frozen: stored as model.param_dtype says (default: compute)
        elif self.model.param_dtype is None:
            self.model.param_dtype = "float32"
        elif self.model.param_dtype != "float32":
            raise ConfigError("model.param_dtype", f"training keeps float32 master weights "
                                                   f"(bfloat16 ones round most small updates "
                                                   f"away); got {self.model.param_dtype!r}: "
                                                   "use model.compute_dtype for bf16 compute")
        self.output_dir = os.path.expanduser(self.output_dir)
        self.log_dir = self.log_dir and os.path.expanduser(self.log_dir)
        self.compilation_cache_dir = (self.compilation_cache_dir
                                      and os.path.expanduser(self.compilation_cache_dir))
        at_least(self, 1, "steps", "prompts_per_step")
        if self.learner.temperature != self.rollout.temperature:
            raise ConfigError("", f"learner.temperature ({self.learner.temperature}) must equal "
                                  f"rollout.temperature ({self.rollout.temperature}): the "
                                  "learner scores tokens under the distribution they were "
                                  "sampled from")
        if (self.validation.every or self.validation.at_start) and not self.data.val:
            raise ConfigError("data.val", "validation is on (validation.every / at_start) but "
                                          "no validation source is given")

    @property
    def checkpoint_dir(self) -> str:
        return self.checkpoint.dir or os.path.join(self.output_dir, "checkpoints")

    @property
    def logs_dir(self) -> str:
        return self.log_dir or os.path.join(self.output_dir, "logs")


def load_train_config(path: str | None, overrides: Sequence[str] = ()) -> TrainConfig:
    """The config from YAML + overrides, every section checked (no device is touched)."""
    return load_config(TrainConfig, path, list(overrides))


def check_devices(config: TrainConfig, device_count: int) -> dict:
    """The mesh's axis sizes over the job's devices; raises UserError when the decode slots
    do not split over mesh.data. (The learner's micro-batches always split over the
    data-parallel axes: batching.py rounds their rows to a multiple of data x fsdp.)"""
    axes = resolve_axes(config.mesh, device_count, "mesh")
    if config.engine.slots % axes["data"]:
        raise ConfigError("engine.slots", f"{config.engine.slots} decode slots do not split "
                                          f"over mesh.data = {axes['data']}")
    return axes
