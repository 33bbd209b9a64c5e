"""A training step's kinds, one object per kind, registered under the `learner.loss` that
names it (`STEP_KINDS`). A kind says what a step collects, how it groups what it collected for
the learner, the loss the learner minimises on it, and what it needs:

- `DapoStep` (`dapo`): collects the agent's rollouts on the runner, scored, shaped and
  filtered (collect.py), a plugin's starts in place of as many drawn rows; groups them as
  sampled, each trajectory's advantage its group's (the trainer's `compute_advantages`); its
  loss is DAPO's clipped policy loss (`dapo.policy_loss`) against old log-probabilities
  recomputed or the rollout's, with a KL reference where `kl_coef` != 0; it needs no plugin.
- `SupervisedStep` (`sft`): collects the plugin's target trajectory for each drawn row
  (nothing is sampled); groups them with the plugin's extra trajectories, each with
  advantage 1; its loss is the negative log-likelihood of their replies
  (`supervised.sft_loss`): no old log-probabilities, no reference, entropy a metric only; it
  needs a plugin.

The learner builds its kind from its section (`step_kind`) and asks it what an update needs
(`recompute_old`, `reference`, `entropy_in_loss`, `metrics`) and for the `loss`; the trainer
calls the same object's `collect` and `groups` with each step's `StepInputs`; the build step
(rl/build.py) checks what it needs (`needs_plugin`) before anything is read.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from memagent_jax.rl.collect import RolloutBatch, collect_batch, supervised_batch
from memagent_jax.rl.config import LearnerConfig
from memagent_jax.rl.dapo import per_token, policy_loss, rollout_mismatch
from memagent_jax.rl.plugin import Plugin, StepContext
from memagent_jax.rl.scoring import Rewarder
from memagent_jax.rl.supervised import sft_loss

# Every loss's metrics (`dapo.policy_loss`'s names; `sft_loss` reports the same).
LOSS_METRICS = ("loss", "pg_loss", "clip_fraction", "dual_clip_fraction", "approx_kl", "kl",
                "entropy")
# The mismatch metrics measured inside the loss when old log-probabilities are the rollout's.
MISMATCH_METRICS = ("rollout_logprob_abs_diff", "rollout_kl_k3", "rollout_outside_clip")


@dataclasses.dataclass(frozen=True)
class StepInputs:
    """What one step's `collect` and `groups` use. config: the TrainConfig; runner: the
    `AgentRunner` the agent's rollouts run on; plugin: None without one; params: the
    parameters that sample; iterator: the data rows; context: the plugin's `StepContext`
    (its `agent` is the config's); seed_for_try(k): rollout round k's sampling seed;
    on_call(row): after every reply; advantages: rewards [G, n] -> advantages [G, n]."""
    config: Any
    runner: Any
    rewarder: Rewarder
    plugin: Plugin | None
    params: Any
    iterator: Any
    context: StepContext
    seed_for_try: Callable[[int], int]
    on_call: Callable
    advantages: Callable[[np.ndarray], np.ndarray]


class DapoStep:
    """`learner.loss: dapo` (module docstring)."""
    needs_plugin = None  # what a plugin is for, where the kind needs one

    def __init__(self, config: LearnerConfig):
        self.config = config
        # Old log-probabilities: recomputed before the first update, or the rollout's; without
        # a recompute, the first mini-batch's forward is the one pass of the learner over the
        # sampled tokens under the parameters that sampled them: the mismatch is measured there.
        self.recompute_old = config.old_logprobs == "recompute"
        self.reference = config.kl_coef != 0.0
        self.entropy_in_loss = config.entropy_coef != 0.0
        self.metrics = LOSS_METRICS + (() if self.recompute_old else MISMATCH_METRICS)

    def collect(self, step: StepInputs) -> RolloutBatch:
        starts = (functools.partial(step.plugin.starts, step.context) if step.plugin
                  else None)
        return collect_batch(step.runner, step.context.agent, step.params, step.iterator,
                             step.config, step.rewarder, step.seed_for_try, step.on_call, starts)

    def groups(self, batch: RolloutBatch, step: StepInputs) -> tuple[list, np.ndarray]:
        """(the trajectory groups to train on, their advantages [G, n])."""
        return batch.groups, step.advantages(batch.rewards)

    def loss(self, logp, batch: dict, entropy):
        """logp, entropy [S, L] -> (the loss to differentiate, its metrics: `metrics`)."""
        config = self.config
        loss, metrics = policy_loss(
            logp, batch["old_logprobs"], batch["advantages"], batch["loss_mask"],
            eps_low=config.eps_low, eps_high=config.eps_high, dual_clip=config.dual_clip,
            ref_logp=batch.get("ref_logprobs"), kl_coef=config.kl_coef, entropy=entropy,
            entropy_coef=config.entropy_coef, row_weights=batch["row_weights"],
            token_weights=batch.get("is_weights"))
        if not self.recompute_old:
            weights = batch["loss_mask"] * per_token(batch["row_weights"])
            metrics.update(rollout_mismatch(jax.lax.stop_gradient(logp), batch["old_logprobs"],
                                            weights, config.eps_low, config.eps_high))
        return loss, metrics


class SupervisedStep:
    """`learner.loss: sft` (module docstring)."""
    needs_plugin = "a supervised step trains on the trajectories a plugin makes"
    recompute_old = reference = entropy_in_loss = False
    metrics = LOSS_METRICS

    def __init__(self, config: LearnerConfig):
        self.config = config

    def collect(self, step: StepInputs) -> RolloutBatch:
        return supervised_batch(step.iterator, step.config.prompts_per_step, step.rewarder,
                                functools.partial(_plugin(step).target, step.context.agent))

    def groups(self, batch: RolloutBatch, step: StepInputs) -> tuple[list, np.ndarray]:
        groups = batch.groups + [[t] for t in _plugin(step).extra_trajectories(step.context)]
        return groups, np.ones(sum(len(g) for g in groups))

    def loss(self, logp, batch: dict, entropy):
        return sft_loss(logp, batch["loss_mask"], batch["row_weights"], entropy)


StepKind = DapoStep | SupervisedStep
STEP_KINDS: dict[str, type[DapoStep] | type[SupervisedStep]] = {
    "dapo": DapoStep, "sft": SupervisedStep}


def step_kind(config: LearnerConfig) -> StepKind:
    """The kind `config.loss` names, built for the learner's section."""
    return STEP_KINDS[config.loss](config)


def _plugin(step: StepInputs) -> Plugin:
    """The step's plugin, which a kind that `needs_plugin` has (`rl/build.py` checks)."""
    assert step.plugin is not None, "a supervised step without its plugin"
    return step.plugin
