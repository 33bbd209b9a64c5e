"""The DAPO learner: PPO mini-batch updates of the policy's parameters.

`Learner.update(rows)` runs one rollout batch's worth of optimisation (docs/algorithm.md
section 3):
1. old log-probabilities: recomputed with the current parameters (the original's default), or
   the rollout's own (`old_logprobs="rollout"`); reference log-probabilities when kl_coef != 0;
2. per PPO epoch, the rows are shuffled and split into `mini_batches` mini-batches; each is one
   AdamW update, its gradient accumulated over static-shape micro-batches (see rows.py) and
   normalised by the mini-batch's response-token count, so the loss is the token-mean over the
   whole mini-batch whatever the micro-batching;
3. a mini-batch whose loss or gradient norm is not finite is skipped: parameters and optimiser
   state stay as they were, and the skip is counted.

The train step is one jitted pure function of (params, optimiser state, step, gradient
accumulator, micro-batch): it adds the micro-batch's gradient to the accumulator and, on the
mini-batch's last micro-batch, applies the update under a `lax.cond`. Parameters, optimiser
state and accumulator are donated, and every output is pinned to its input's sharding, so
`learner.params` (the `Params` tree, as optax and Orbax take it) always has the shardings the
rollout engine was built for: the trainer passes it to the next rollout as it is, with no copy
or reshard. Because the update donates the previous parameters, any reference to them kept
across an update is a deleted array, and using it fails loudly.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from memagent_jax.errors import ConfigError
from memagent_jax.models.qwen2 import Params, Qwen2, split_params
from memagent_jax.models.sharding import batch_sharding
from memagent_jax.rl.dapo import policy_loss
from memagent_jax.rl.rows import (TrainingRows, default_bucket_lengths, gather,
                                  plan_micro_batches, scatter)
from memagent_jax.runconfig import at_least


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """Optimisation settings (the `learner` section of the train config). The defaults are the
    original's (docs/algorithm.md section 3) except eps_high 0.28 (DAPO clip-higher; the
    original scripts ran 0.2), kl_coef 0 and mini_batches 1 (the shipped 7B configs set the
    original's 0.001 and 16).

    lr_schedule: "constant" or "cosine" after `warmup_steps` linear warm-up steps (step s of
    the warm-up uses lr * (s + 1) / warmup_steps); cosine decays to lr * min_lr_ratio at
    `total_steps` optimiser updates. mini_batches: optimiser updates per rollout batch (per
    epoch). Micro-batches hold `micro_batch_rows` rows when it is set, else
    `micro_batch_tokens` padded tokens.
    old_logprobs: "recompute" (with the parameters before this batch's first update) or
    "rollout" (the sampler's). temperature: the rollout's sampling temperature (log-probs are
    those of logits / temperature). bucket_lengths: row lengths micro-batches are padded to
    (default: powers of two from 64, up to what the rows need). normalize_std: read by the
    trainer when it computes advantages (dividing by the group std), kept here with the other
    algorithm settings. remat: keep only each decoder layer's input for the backward and
    recompute the rest of the layer (activation memory one [rows, length, hidden] per layer,
    for rerunning each layer's forward in the backward).
    """
    SECTION: ClassVar[str] = "learner"
    lr: float = 1e-6
    warmup_steps: int = 20
    lr_schedule: str = "constant"
    total_steps: int | None = None
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.01
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0
    eps_low: float = 0.2
    eps_high: float = 0.28
    dual_clip: float | None = 3.0
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    temperature: float = 1.0
    mini_batches: int = 1
    micro_batch_rows: int | None = None
    micro_batch_tokens: int | None = 8192
    ppo_epochs: int = 1
    remat: bool = False
    old_logprobs: str = "recompute"
    normalize_std: bool = False
    bucket_lengths: tuple[int, ...] | None = None
    seed: int = 0

    def __post_init__(self):
        def fail(name, message):
            raise ConfigError(f"learner.{name}", f"{message}, got {getattr(self, name)!r}")

        at_least(self, 0, "warmup_steps")
        at_least(self, 1, "mini_batches", "ppo_epochs", "micro_batch_rows",
                 "micro_batch_tokens")
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
        if self.micro_batch_rows is None and self.micro_batch_tokens is None:
            fail("micro_batch_tokens", "set micro_batch_rows or micro_batch_tokens")
        if self.old_logprobs not in ("recompute", "rollout"):
            fail("old_logprobs", "must be 'recompute' or 'rollout'")
        if self.bucket_lengths is not None and (not self.bucket_lengths
                                                or min(self.bucket_lengths) < 2):
            fail("bucket_lengths", "must be a non-empty list of lengths >= 2")

    def learning_rate(self, step):
        """The learning rate of optimiser update `step` (0-based; jnp scalar or int)."""
        step = jnp.asarray(step, jnp.float32)
        warm = (jnp.minimum(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps
                else jnp.float32(1.0))
        if self.lr_schedule == "constant":
            return self.lr * warm
        span = self.total_steps - self.warmup_steps
        progress = jnp.clip((step - self.warmup_steps) / span, 0.0, 1.0)
        cosine = self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + jnp.cos(math.pi *
                                                                               progress))
        return self.lr * jnp.where(step < self.warmup_steps, warm, cosine)


class Learner:
    """Trains the parameters of `model`; see the module docstring.

    The learner takes the model's parameters over: its first update donates them, so the
    module must not be run afterwards (it fails loudly if it is); `params` are the current
    ones. mesh: the mesh they are sharded on (the engine's), or None for a model on one device.
    With kl_coef != 0 the frozen KL reference is a device copy of the initial parameters.
    """

    def __init__(self, model: Qwen2, config: LearnerConfig = LearnerConfig(), mesh=None):
        self.config, self.mesh = config, mesh
        self.graphdef, params = split_params(model)
        # Commit the arrays to the devices they are on (no copy): a model built without a mesh
        # holds uncommitted arrays, and jit would compile the step again once its outputs,
        # which are committed, come back as inputs.
        self._params = jax.tree.map(lambda x: jax.device_put(x, x.sharding), params)
        self._param_shardings = jax.tree.map(lambda x: x.sharding, self._params)
        self._scalar = (NamedSharding(mesh, PartitionSpec()) if mesh is not None
                        else jax.tree.leaves(self._param_shardings)[0])
        self._batch_sharding = batch_sharding(mesh) if mesh is not None else self._scalar
        self._row_multiple = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]

        self._tx = optax.chain(
            optax.clip_by_global_norm(config.max_grad_norm),
            optax.adamw(config.learning_rate, b1=config.adam_b1, b2=config.adam_b2,
                        eps=config.adam_eps, weight_decay=config.weight_decay))
        opt_abstract = jax.eval_shape(self._tx.init, self._params)
        self._opt_shardings = optax.tree_map_params(
            self._tx, lambda _, s: s, opt_abstract, self._param_shardings,
            transform_non_params=lambda _: self._scalar)
        self._opt_state = jax.jit(self._tx.init, out_shardings=self._opt_shardings)(self._params)
        self._step = jax.device_put(jnp.int32(0), self._scalar)
        self._accumulator = None  # gradient sums, allocated on the first update

        self._ref_params = None
        if config.kl_coef != 0.0:
            # A copy (may_alias=False): the policy's own buffers are donated by every update.
            self._ref_params = jax.tree.map(
                lambda x: jax.device_put(x, x.sharding, may_alias=False), self._params)

        self._logprobs = jax.jit(self._logprobs_fn)
        acc_shardings = (self._param_shardings, self._metric_shardings(self._metric_names()))
        self._train_step = jax.jit(
            self._train_step_fn, donate_argnums=(0, 1, 3),
            out_shardings=(self._param_shardings, self._opt_shardings, self._scalar,
                           acc_shardings, self._metric_shardings(self._update_metric_names())))

    # ---- public API ---------------------------------------------------------------------

    @property
    def params(self) -> Params:
        """The current parameters, on the model's shardings; valid until the next update or
        restore (see the module docstring)."""
        return self._params

    @property
    def step(self) -> int:
        """Optimiser updates applied so far (skipped ones do not count)."""
        return int(self._step)

    def state(self) -> dict[str, Any]:
        """{params, opt_state, step}: everything to checkpoint (nested dicts, optax tuples and
        arrays, on their shardings)."""
        return {"params": self._params, "opt_state": self._opt_state, "step": self._step}

    def restore(self, state: dict[str, Any]) -> None:
        """Takes parameters, optimiser state and step from a `state()`-shaped tree (e.g. an
        Orbax restore), placed on this learner's shardings; `params` are then the restored
        ones."""
        if jax.tree.structure(state["params"]) != jax.tree.structure(self._params):
            raise ValueError("restore: the parameter tree does not match the model's")
        put = functools.partial(jax.tree.map, lambda x, s: jax.device_put(x, s))
        self._params = put(state["params"], self._param_shardings)
        self._opt_state = put(state["opt_state"], self._opt_shardings)
        self._step = jax.device_put(jnp.asarray(state["step"], jnp.int32), self._scalar)

    def logprobs(self, rows: TrainingRows, params=None) -> np.ndarray:
        """[R, T] float32: each token's log-probability (at the config's temperature) under
        the current (or the given pure-dict) parameters, aligned with rows.tokens; 0 at
        position 0 and beyond each row's length."""
        params = self._params if params is None else params
        out = np.zeros(rows.tokens.shape, np.float32)
        for plan in self._plan(rows, range(len(rows))):
            batch = gather(plan, {"tokens": rows.tokens})
            values = self._logprobs(params, jax.device_put(batch["tokens"], self._batch_sharding))
            scatter(plan, np.asarray(values), out)
        mask = np.arange(out.shape[1])[None, :] < rows.lengths[:, None]
        return np.where(mask, out, 0.0).astype(np.float32)

    def update(self, rows: TrainingRows) -> dict[str, float]:
        """One rollout batch of PPO updates; returns mean loss, pg_loss, clip_fraction,
        dual_clip_fraction, approx_kl, kl, entropy, grad_norm over the applied updates, the lr
        of the last one, updates and skipped_updates counts, and tokens (response tokens
        trained on, all epochs)."""
        config = self.config
        arrays = {"tokens": rows.tokens, "loss_mask": rows.loss_mask,
                  "advantages": rows.advantages,
                  "old_logprobs": (rows.rollout_logprobs if config.old_logprobs == "rollout"
                                   else self.logprobs(rows))}
        if self._ref_params is not None:
            arrays["ref_logprobs"] = self.logprobs(rows, self._ref_params)
        if self._accumulator is None:
            self._accumulator = self._zero_accumulator()
        rng = np.random.default_rng((config.seed, self.step))
        results = []
        for _ in range(config.ppo_epochs):
            for indices in np.array_split(rng.permutation(len(rows)), config.mini_batches):
                if len(indices):
                    results.append(self._update_mini_batch(arrays, rows, indices))
        return self._summarise(jax.device_get(results), rows)

    # ---- the mini-batch loop ------------------------------------------------------------

    def _plan(self, rows: TrainingRows, indices):
        config = self.config
        buckets = config.bucket_lengths or default_bucket_lengths(int(rows.lengths.max()))
        by_rows = config.micro_batch_rows is not None
        return plan_micro_batches(rows.lengths, indices, buckets, rows=config.micro_batch_rows,
                                  tokens=None if by_rows else config.micro_batch_tokens,
                                  row_multiple=self._row_multiple)

    def _update_mini_batch(self, arrays, rows: TrainingRows, indices):
        token_count = jnp.float32(max(float(rows.loss_mask[indices].sum()), 1.0))
        plans = self._plan(rows, indices)
        for k, plan in enumerate(plans):
            batch = jax.device_put(gather(plan, arrays), self._batch_sharding)
            self._params, self._opt_state, self._step, self._accumulator, out = self._train_step(
                self._params, self._opt_state, self._step, self._accumulator, batch,
                token_count, jnp.bool_(k == len(plans) - 1))
        return out

    def _summarise(self, results, rows: TrainingRows) -> dict[str, float]:
        applied = [r for r in results if not r["skipped"]]
        summary = {}
        for name in self._metric_names() + ("grad_norm",):
            values = [float(r[name]) for r in applied]
            summary[name] = float(np.mean(values)) if values else float("nan")
        summary["lr"] = float(applied[-1]["lr"]) if applied else float("nan")
        summary["updates"] = float(len(applied))
        summary["skipped_updates"] = float(len(results) - len(applied))
        summary["tokens"] = float(rows.response_tokens * self.config.ppo_epochs)
        return summary

    # ---- pure functions (jitted in __init__) --------------------------------------------

    def _logits(self, params, tokens, remat=False):
        """params: pure dict; tokens [B, L] right-padded -> logits [B, L, V] / temperature.

        No attention mask: the padding sits after every real token, so the model's causal path
        from position 0 (its configured attention: the blocked kernel, or cuDNN's on a GPU; no
        [L, L] scores in the forward or the gradient) gives the real positions exactly what a
        mask would. The recompute of old
        log-probabilities runs the same path, so before the first update the ratios are exactly
        1. remat: checkpoint the model's layers (for the differentiated loss; same values)."""
        model = nnx.merge(self.graphdef, params)
        return model(tokens, remat=remat) / self.config.temperature

    def _logprobs_fn(self, params, tokens):
        logp, _ = token_logprobs(self._logits(params, tokens), tokens, entropy=False)
        return logp

    def _loss_fn(self, params, batch, token_count):
        config = self.config
        logits = self._logits(params, batch["tokens"], remat=config.remat)
        logp, entropy = token_logprobs(logits, batch["tokens"], entropy=True)
        if config.entropy_coef == 0.0:
            entropy = jax.lax.stop_gradient(entropy)  # a metric only
        return policy_loss(logp, batch["old_logprobs"], batch["advantages"], batch["loss_mask"],
                           eps_low=config.eps_low, eps_high=config.eps_high,
                           dual_clip=config.dual_clip, ref_logp=batch.get("ref_logprobs"),
                           kl_coef=config.kl_coef, entropy=entropy,
                           entropy_coef=config.entropy_coef, token_count=token_count)

    def _train_step_fn(self, params, opt_state, step, accumulator, batch, token_count, finish):
        """One micro-batch: accumulate its gradient; if `finish`, apply the mini-batch's update
        (or skip it when the loss or gradient norm is not finite) and reset the accumulator."""
        (_, metrics), grads = jax.value_and_grad(self._loss_fn, has_aux=True)(
            params, batch, token_count)
        grad_sum = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), accumulator[0], grads)
        metric_sum = {k: accumulator[1][k] + metrics[k] for k in accumulator[1]}

        def apply(_):
            grad_norm = optax.tree.norm(grad_sum)
            ok = jnp.isfinite(grad_norm) & jnp.isfinite(metric_sum["loss"])

            def update(_):
                updates, new_opt = self._tx.update(grad_sum, opt_state, params)
                return optax.apply_updates(params, updates), new_opt, step + 1

            new_params, new_opt, new_step = jax.lax.cond(
                ok, update, lambda _: (params, opt_state, step), None)
            out = dict(metric_sum, grad_norm=grad_norm, lr=self.config.learning_rate(step),
                       skipped=~ok)
            return new_params, new_opt, new_step, _zeros_like(accumulator), out

        def carry(_):
            out = {name: jnp.zeros((), jnp.bool_ if name == "skipped" else jnp.float32)
                   for name in self._update_metric_names()}
            return params, opt_state, step, (grad_sum, metric_sum), out

        return jax.lax.cond(finish, apply, carry, None)

    # ---- helpers ------------------------------------------------------------------------

    @staticmethod
    def _metric_names() -> tuple[str, ...]:
        return ("loss", "pg_loss", "clip_fraction", "dual_clip_fraction", "approx_kl", "kl",
                "entropy")

    def _update_metric_names(self) -> tuple[str, ...]:
        return self._metric_names() + ("grad_norm", "lr", "skipped")

    def _metric_shardings(self, names):
        return {name: self._scalar for name in names}

    def _zero_accumulator(self):
        grads = jax.jit(lambda p: jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), p),
                        out_shardings=self._param_shardings)(self._params)
        metrics = {name: jax.device_put(jnp.float32(0), self._scalar)
                   for name in self._metric_names()}
        return grads, metrics


def token_logprobs(logits, tokens, entropy: bool = True):
    """logits [B, L, V] (already divided by the temperature), tokens [B, L] ->
    (logp [B, L]: log p(tokens[:, t] | tokens[:, :t]), 0 at t = 0; entropy [B, L] of the
    distribution token t was drawn from, 0 at t = 0, or None).

    Uses log p = logit - logsumexp(logits), so no [B, L, V] log-softmax is kept beside the
    logits."""
    logits = logits[:, :-1].astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, tokens[:, 1:, None], axis=-1)[..., 0]
    pad = ((0, 0), (1, 0))
    logp = jnp.pad(picked - lse, pad)
    if not entropy:
        return logp, None
    probs = jax.nn.softmax(logits, axis=-1)
    ent = lse - jnp.sum(probs * logits, axis=-1)
    return logp, jnp.pad(ent, pad)


def _zeros_like(tree):
    return jax.tree.map(jnp.zeros_like, tree)
