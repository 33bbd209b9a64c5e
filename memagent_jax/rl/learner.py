"""The DAPO learner: PPO mini-batch updates of the policy's parameters.

`Learner.update(rows)` runs one rollout batch's worth of optimisation (docs/algorithm.md
section 3):
1. old log-probabilities: recomputed with the current parameters (the original's default), or
   the rollout's own (`old_logprobs="rollout"`); reference log-probabilities when kl_coef != 0;
2. per PPO epoch, the rows are split into `mini_batches` mini-batches (batching.py, which also
   says how each token is weighted); each is one AdamW update, its gradient accumulated over
   static-shape micro-batches of sequences, each holding several rows (`pack`) or one;
3. a mini-batch whose loss or gradient norm is not finite is skipped: parameters and optimiser
   state stay as they were, and the skip is counted.
With `rollout_correction` C, each token's policy-gradient loss is multiplied by verl's truncated
importance-sampling weight min(exp(old - rollout log-prob), C) (dapo.truncated_is_weights).
Each update also reports how far the learner's log-probabilities of the sampled tokens are from
the engine's (dapo.rollout_mismatch): over the whole batch from the recomputed old
log-probabilities, or, with `old_logprobs="rollout"` (no recompute), from the first
mini-batch's forward, which runs before any update (the rows of that mini-batch only).
Every optimiser update of one `update` call uses the learning rate of that training step
(verl advances its scheduler once per step, not per update).

Precision: the parameters (the master weights) and the optimiser state are stored in the
model's parameter dtype (float32 for training), and the forward and backward run in the
model's compute dtype (the weights are cast at each use, as FSDP's mixed precision does);
gradients are accumulated in float32. The rollout engine makes its own copy, in the compute
dtype and its own layout (`engine.engine.Engine.place`).

With `learner.lora` the trained parameters are LoRA adapters (models/lora.py: float32, on
their base weight's shardings), and the model's own parameters are the frozen base, kept in
the dtype they were loaded in, with no gradient accumulator or optimiser state. Every forward
merges the adapters into the base inside its jitted function (W + alpha/r AB in the compute
dtype; the gradient reaches A and B through the sum); `params` is a merged copy for the
engine, made at each call. The KL reference is the base (the initial adapters' B is zero).

The train step is one jitted pure function of (params, optimiser state, step, gradient
accumulator, micro-batch, lr): it adds the micro-batch's gradient to the accumulator and, on
the mini-batch's last micro-batch, applies the update under a `lax.cond`. Parameters,
optimiser state and accumulator are donated, and every output is pinned to its input's
sharding, so `learner.params` (the `Params` tree, as optax and Orbax take it) keeps its
shardings from update to update (the engine's copy is placed from them). Because the update
donates the previous parameters, any reference to them kept across an update is a deleted
array, and using it fails loudly.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from memagent_jax.models import lora
from memagent_jax.models.config import Remat
from memagent_jax.models.qwen import Params, Qwen, split_params
from memagent_jax.models.sharding import batch_sharding
from memagent_jax.rl import batching
from memagent_jax.rl.config import LearnerConfig
from memagent_jax.rl.dapo import rollout_mismatch, truncated_is_weights
from memagent_jax.rl.logprobs import token_logprobs
from memagent_jax.rl.rows import TrainingRows
from memagent_jax.rl.steps import MISMATCH_METRICS, step_kind


class Learner:
    """Trains the parameters of `model`; see the module docstring.

    The learner takes the model's parameters over: its first update donates them, so the
    module must not be run afterwards (it fails loudly if it is); `params` are the current
    ones. With `config.lora` it trains adapters on them instead (module docstring), drawn from
    `seed`, and the module's parameters stay as they are. The model's parameter dtype is what the
    learner stores and updates (float32 for training; bfloat16 master weights would round most
    lr-1e-6 updates away), its compute dtype what the forward and backward run in. mesh: the mesh
    they are sharded on (the engine's), or None for a model on one device. seed: the run's (`seed`),
    which with the optimiser step seeds the mini-batch shuffle. With kl_coef != 0 the frozen KL
    reference is a device copy of the initial parameters in the compute dtype (what every forward
    uses). A model whose parameters are `jax.ShapeDtypeStruct`s with shardings (`nnx.eval_shape`,
    `models.loading.abstract_params`; devices this machine may not have, such as a TPU topology's)
    gives a learner that holds no arrays: only `compiled()` works on it.
    """

    def __init__(self, model: Qwen, config: LearnerConfig = LearnerConfig(), mesh=None,
                 seed: int = 0):
        self.config, self.mesh, self.seed = config, mesh, seed
        self.kind = step_kind(config)  # the step's kind: what `update` minimises (steps.py)
        self.vocab_size = model.config.vocab_size
        self.graphdef, params = split_params(model)
        self.abstract = all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params))
        # Commit the arrays to the devices they are on (no copy): a model built without a mesh
        # holds uncommitted arrays, and jit would compile the step again once its outputs,
        # which are committed, come back as inputs.
        params = params if self.abstract else jax.tree.map(
            lambda x: jax.device_put(x, x.sharding), params)
        self.lora = config.lora
        self._base: Params | None = None  # the frozen base under LoRA
        if self.lora is not None:
            self._base, self._base_shardings = params, jax.tree.map(lambda x: x.sharding, params)
            params = (lora.abstract_adapters(model.config, self.lora, mesh) if self.abstract
                      else lora.init_adapters(model.config, self.lora, seed, mesh))
        stored = {jnp.dtype(x.dtype).name for x in jax.tree.leaves(params)}
        if stored != {"float32"}:
            raise ValueError(f"the learner keeps float32 master weights; the model's are "
                             f"{', '.join(sorted(stored))} (load it with param_dtype float32 "
                             "and compute in bfloat16 instead)")
        self._params = params
        self._param_shardings = jax.tree.map(lambda x: x.sharding, self._params)
        self._scalar = (NamedSharding(mesh, PartitionSpec()) if mesh is not None
                        else jax.tree.leaves(self._param_shardings)[0])
        self._batch_sharding = batch_sharding(mesh) if mesh is not None else self._scalar
        self._row_multiple = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]

        # AdamW without its learning-rate scaling: the step multiplies by the training step's
        # lr, which it is given (verl's scheduler counts training steps, not updates).
        self._tx = optax.chain(
            optax.clip_by_global_norm(config.max_grad_norm),
            optax.scale_by_adam(b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps),
            optax.add_decayed_weights(config.weight_decay))
        opt_abstract = jax.eval_shape(self._tx.init, self._params)
        self._opt_shardings = optax.tree_map_params(
            self._tx, lambda _, s: s, opt_abstract, self._param_shardings,
            transform_non_params=lambda _: self._scalar)
        self._opt_state = self._make(self._tx.init, self._opt_shardings, self._params)
        self._step = self._make(lambda: jnp.int32(0), self._scalar)
        self._train_steps = 0
        self._accumulator = None  # gradient sums, allocated on the first update

        self.compute_dtype = model.dtype
        cast = functools.partial(jax.tree.map, lambda x: x.astype(self.compute_dtype))
        # A copy even when no cast is needed: the policy's own buffers are donated by every
        # update.
        self._ref_params = (self._make(cast, self._param_shardings, self._params)
                            if self.kind.reference else None)
        # The micro-batch's arrays (batching.FIELDS): what `update` gathers, `compiled` shapes.
        self._fields = batching.batch_fields(config, reference=self._ref_params is not None)

        # Replicated: the host reads it, and on a pod no process holds every shard.
        self._logprobs = jax.jit(self._logprobs_fn, out_shardings=self._scalar)
        self._merged = (None if self.lora is None else jax.jit(
            functools.partial(_merge_adapters, scale=self.lora.scale),
            out_shardings=self._base_shardings))
        acc_shardings = (self._param_shardings, self._metric_shardings(self._metric_names()))
        self._train_step = jax.jit(
            self._train_step_fn, donate_argnums=(0, 1, 3),
            out_shardings=(self._param_shardings, self._opt_shardings, self._scalar,
                           acc_shardings, self._metric_shardings(self._update_metric_names())))

    def _make(self, fn, shardings, *args):
        """fn(*args) placed on `shardings`: computed, or only its shapes on an abstract
        learner."""
        if not self.abstract:
            return jax.jit(fn, out_shardings=shardings)(*args)
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            jax.eval_shape(fn, *args), shardings)

    # ---- public API ---------------------------------------------------------------------

    @property
    def params(self) -> Params:
        """The current parameters, on the model's shardings; valid until the next update or
        restore (see the module docstring). Under LoRA, a new merged copy of the base and the
        adapters at each call (the adapters themselves: `state()["params"]`)."""
        if self._merged is not None:
            return self._merged(self._params, self._base)
        return self._params

    @property
    def base(self) -> Params | None:
        """The frozen base under LoRA (None: full-parameter training)."""
        return self._base

    @property
    def step(self) -> int:
        """Optimiser updates applied so far (skipped ones do not count)."""
        return int(self._step)

    @property
    def train_steps(self) -> int:
        """`update` calls so far: the training step the learning-rate schedule is at."""
        return self._train_steps

    def state(self) -> dict[str, Any]:
        """{params, opt_state, step, train_steps}: everything to checkpoint (nested dicts,
        optax tuples and arrays, on their shardings); under LoRA, params are the adapters
        (the base is the model the run loads)."""
        return {"params": self._params, "opt_state": self._opt_state, "step": self._step,
                "train_steps": jax.device_put(jnp.int32(self._train_steps), self._scalar)}

    def restore(self, state: dict[str, Any]) -> None:
        """Takes parameters, optimiser state and step from a `state()`-shaped tree (e.g. an
        Orbax restore), placed on this learner's shardings; `params` are then the restored
        ones."""
        # (jax's stubs type no comparison of tree structures)
        if jax.tree.structure(state["params"]) != jax.tree.structure(  # type: ignore[operator]
                self._params):
            raise ValueError("restore: the parameter tree does not match the model's")
        put = functools.partial(jax.tree.map, lambda x, s: jax.device_put(x, s))
        self._params = put(state["params"], self._param_shardings)
        self._opt_state = put(state["opt_state"], self._opt_shardings)
        self._step = jax.device_put(jnp.asarray(state["step"], jnp.int32), self._scalar)
        self._train_steps = int(state["train_steps"])

    def compiled(self, rows: int, length: int, width: int | None = None
                 ) -> dict[str, jax.stages.Compiled]:
        """The train step (one micro-batch's gradient and the AdamW update) and the log-prob
        pass, compiled from shapes for micro-batches of `rows` sequences x `length` tokens
        with up to `width` response tokens each (None: length), packed as the config says, on
        this learner's shardings, for their `memory_analysis()` and `cost_analysis()` (nothing
        is run or allocated; benchmarks/aot.py)."""
        width = width or length

        def like(x, sharding):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

        params = jax.tree.map(like, self._params, self._param_shardings)
        opt_state = jax.tree.map(like, self._opt_state, self._opt_shardings)
        scalar = functools.partial(jax.ShapeDtypeStruct, (), sharding=self._scalar)
        grads = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, jnp.float32,
                                                               sharding=s),
                             self._params, self._param_shardings)
        accumulator = (grads, {name: scalar(jnp.float32) for name in self._metric_names()})
        batch = batching.abstract_batch(self._fields, rows, length, width,
                                        self._batch_sharding)
        inputs = {name: batch[name] for name in batching.forward_fields(self._fields)}
        base = (None if self._base is None
                else jax.tree.map(like, self._base, self._base_shardings))
        return {"train step": self._train_step.lower(
                    params, opt_state, scalar(jnp.int32), accumulator, batch,
                    scalar(jnp.float32), scalar(jnp.bool_), base).compile(),
                "log-probs": self._logprobs.lower(params, inputs, base).compile()}

    def logprobs(self, rows: TrainingRows, params=None) -> np.ndarray:
        """[R, T] float32: each response token's log-probability (at the config's
        temperature) under the current (or the given pure-dict) parameters (under LoRA: the
        adapters, on the base), aligned with rows.tokens; 0 on the prompt and beyond each
        row's length."""
        return self._logprobs_under(rows, [self._params if params is None else params])[0]

    def _logprobs_under(self, rows: TrainingRows, param_sets: list) -> list[np.ndarray]:
        """`logprobs` under each of `param_sets`, the rows planned and each micro-batch
        gathered and sent to the devices once for all of them."""
        outs = [np.zeros(rows.tokens.shape, np.float32) for _ in param_sets]
        forward = batching.forward_fields(self._fields)
        for plan in self._plan(rows, range(len(rows))):
            batch = jax.device_put(batching.gather(plan, rows, forward, {}),
                                   self._batch_sharding)
            for params, out in zip(param_sets, outs):
                batching.scatter(plan, np.asarray(self._logprobs(params, batch, self._base)),
                                 out)
        positions = np.arange(rows.tokens.shape[1])[None, :]
        mask = (positions >= rows.prompt_lengths[:, None]) & (positions < rows.lengths[:, None])
        return [np.where(mask, out, 0.0).astype(np.float32) for out in outs]

    def update(self, rows: TrainingRows) -> dict[str, float]:
        """One training step: a rollout batch of PPO updates, all at this step's learning rate;
        returns mean loss, pg_loss, clip_fraction, dual_clip_fraction, approx_kl, kl, entropy,
        grad_norm over the applied updates, the lr, updates and skipped_updates counts, and
        tokens (response tokens trained on, all epochs).

        A DAPO update also returns rollout_logprob_abs_diff, rollout_kl_k3 and
        rollout_outside_clip (`dapo.rollout_mismatch`: the learner's log-probabilities of the
        sampled tokens, before this update, against the rollout's): the token mean over every
        response token from the
        recomputed old log-probabilities, or with old_logprobs "rollout" over the first
        mini-batch's tokens as the loss weighs them (NaN if that forward was not finite). With
        rollout_correction: rollout_is_weight and rollout_is_capped_fraction, the mean
        importance weight and the fraction of tokens at the cap."""
        outside = rows.tokens[(rows.tokens < 0) | (rows.tokens >= self.vocab_size)]
        if outside.size:  # the embedding lookup would read NaN rows for them, silently
            raise ValueError(f"training rows hold token id {outside[0]}, outside the model's "
                             f"vocabulary of {self.vocab_size} ids")
        config = self.config
        recompute = self.kind.recompute_old
        reference = [] if self._ref_params is None else [self._ref_params]
        computed = self._logprobs_under(rows, [self._params] * recompute + reference)
        old = computed[0] if recompute else rows.rollout_logprobs
        arrays = {"old_logprobs": old}
        extra = {}
        mask = rows.loss_mask > 0
        if recompute:  # float64 on the response tokens alone: f32 runs differ by ~1e-7
            extra = {k: float(v) for k, v in rollout_mismatch(
                old[mask].astype(np.float64), rows.rollout_logprobs[mask].astype(np.float64),
                1.0 / max(mask.sum(), 1), config.eps_low, config.eps_high, xp=np).items()}
        if config.rollout_correction is not None:
            arrays["is_weights"] = truncated_is_weights(old, rows.rollout_logprobs,
                                                        config.rollout_correction)
            extra["rollout_is_weight"] = float(arrays["is_weights"][mask].mean())
            extra["rollout_is_capped_fraction"] = float(
                (arrays["is_weights"][mask] >= config.rollout_correction).mean())
        if self._ref_params is not None:
            arrays["ref_logprobs"] = computed[-1]
        if self._accumulator is None:
            self._accumulator = self._zero_accumulator()
        rng = np.random.default_rng((self.seed, self.step))
        lr = jax.device_put(jnp.float32(config.learning_rate(self.train_steps)), self._scalar)
        results = []
        for _ in range(config.ppo_epochs):
            for indices, weights in self.mini_batches_of(rows, rng):
                results.append(self._update_mini_batch(arrays, rows, indices, weights, lr))
        self._train_steps += 1
        return {**self._summarise(jax.device_get(results), rows), **extra}

    # ---- the mini-batch loop ------------------------------------------------------------

    def _plan(self, rows: TrainingRows, indices) -> list[batching.MicroBatchPlan]:
        return batching.plan(self.config, rows.lengths, indices, self._row_multiple)

    def mini_batches_of(self, rows: TrainingRows, rng):
        """An epoch's mini-batches of `rows` (rl/batching.py `mini_batches`): (row indices,
        row weights) each, in the order `update` applies them."""
        return batching.mini_batches(self.config, rows.loss_mask.sum(axis=1), rows.trajectory,
                                     rows.turn, rows.final, rng, self._row_multiple)

    def _update_mini_batch(self, arrays, rows: TrainingRows, indices, weights, lr):
        """arrays: the update's [R, T] arrays beyond the rows' own; weights [R]: each row's
        token weight."""
        plans = self._plan(rows, indices)
        for k, plan in enumerate(plans):
            batch = jax.device_put(
                batching.gather(plan, rows, self._fields, {**arrays, "row_weights": weights}),
                self._batch_sharding)
            self._params, self._opt_state, self._step, self._accumulator, out = self._train_step(
                self._params, self._opt_state, self._step, self._accumulator, batch, lr,
                jnp.bool_(k == len(plans) - 1), self._base)
        return out

    def _summarise(self, results, rows: TrainingRows) -> dict[str, float]:
        applied = [r for r in results if not r["skipped"]]
        summary = {}
        for name in self._metric_names() + ("grad_norm",):
            if name in MISMATCH_METRICS:  # the first mini-batch's, before any update
                summary[name] = float(results[0][name])
                continue
            values = [float(r[name]) for r in applied]
            summary[name] = float(np.mean(values)) if values else float("nan")
        summary["lr"] = float(applied[-1]["lr"]) if applied else float("nan")
        summary["updates"] = float(len(applied))
        summary["skipped_updates"] = float(len(results) - len(applied))
        summary["tokens"] = float(rows.response_tokens * self.config.ppo_epochs)
        return summary

    # ---- pure functions (jitted in __init__) --------------------------------------------

    def _token_logprobs(self, params, batch, base, remat: Remat = "none", entropy=False):
        """params: pure dict (under LoRA the adapters, merged into `base` here); batch: tokens
        [S, L] (rows end to end, then padding), segment_ids [S, L] when packed, positions
        [S, W] (the response tokens) -> (logp [S, L], entropy [S, L] or None) at the config's
        temperature on those positions (0 elsewhere), the LM head applied `logit_chunk_tokens`
        positions at a time (rl/logprobs.py).

        No attention mask: the padding sits after every real token and each packed row is a
        segment (attention within it, positions from 0), so the model's causal path (its
        configured attention: the blocked kernel, splash, or cuDNN's on a GPU; no [L, L]
        scores in the forward or the gradient) gives each row exactly what it alone would
        give. The recompute of old log-probabilities runs the same path, so before the first
        update the ratios are 1 up to rounding (a row may sit at another offset of another
        sequence there than in its mini-batch: ~1e-7 in float32). remat: the model's policy
        for the differentiated loss (same values)."""
        if base is not None:
            assert self.lora is not None
            params = lora.merge(base, params, self.lora.scale, self.compute_dtype)
        model = nnx.merge(self.graphdef, params)
        hidden = model.hidden(batch["tokens"], remat=remat,
                              segment_ids=batch.get("segment_ids"))
        return token_logprobs(lambda h: model.logits(h) / self.config.temperature, hidden,
                              batch["tokens"], self.config.logit_chunk_tokens, entropy,
                              batch["positions"])

    def _logprobs_fn(self, params, batch, base):
        return self._token_logprobs(params, batch, base)[0]

    def _loss_fn(self, params, batch, base):
        logp, entropy = self._token_logprobs(params, batch, base, self.config.remat, True)
        if not self.kind.entropy_in_loss:
            entropy = jax.lax.stop_gradient(entropy)  # a metric only
        return self.kind.loss(logp, batch, entropy)

    def _train_step_fn(self, params, opt_state, step, accumulator, batch, lr, finish, base):
        """One micro-batch: accumulate its gradient; if `finish`, apply the mini-batch's update
        at learning rate `lr` (or skip it when the loss or gradient norm is not finite) and
        reset the accumulator. base: the frozen base under LoRA (params: the adapters), else
        None."""
        (_, metrics), grads = jax.value_and_grad(self._loss_fn, has_aux=True)(params, batch,
                                                                              base)
        grad_sum = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), accumulator[0], grads)
        metric_sum = {k: accumulator[1][k] + metrics[k] for k in accumulator[1]}

        def apply(_):
            grad_norm = optax.tree.norm(grad_sum)
            ok = jnp.isfinite(grad_norm) & jnp.isfinite(metric_sum["loss"])

            def update(_):
                updates, new_opt = self._tx.update(grad_sum, opt_state, params)
                updates = jax.tree.map(lambda u: -lr * u, updates)
                return optax.apply_updates(params, updates), new_opt, step + 1

            new_params, new_opt, new_step = jax.lax.cond(
                ok, update, lambda _: (params, opt_state, step), None)
            out = dict(metric_sum, grad_norm=grad_norm, lr=lr, skipped=~ok)
            return new_params, new_opt, new_step, _zeros_like(accumulator), out

        def carry(_):
            out = {name: jnp.zeros((), jnp.bool_ if name == "skipped" else jnp.float32)
                   for name in self._update_metric_names()}
            return params, opt_state, step, (grad_sum, metric_sum), out

        return jax.lax.cond(finish, apply, carry, None)

    # ---- helpers ------------------------------------------------------------------------

    def _metric_names(self) -> tuple[str, ...]:
        """The loss's metrics, summed over a mini-batch's micro-batches."""
        return self.kind.metrics

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


def _zeros_like(tree):
    return jax.tree.map(jnp.zeros_like, tree)


def _merge_adapters(adapters, base, scale: float) -> Params:
    return lora.merge(base, adapters, scale)

