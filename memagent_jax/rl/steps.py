"""A training step's batch, one object per kind of step, which the trainer builds once
(`make_step`):

- `PolicyStep` (`learner.loss: dapo`): the agent's rollouts on the runner, scored, shaped and
  filtered (collect.py); a plugin's starts take the place of drawn rows; each trajectory's
  advantage is its group's (the trainer's `compute_advantages`);
- `SupervisedStep` (`learner.loss: sft`): the plugin's target trajectory for each drawn row
  and its extra trajectories, each with advantage 1; nothing is sampled.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from memagent_jax.rl.collect import RolloutBatch, collect_batch, supervised_batch
from memagent_jax.rl.objectives import OBJECTIVES
from memagent_jax.rl.plugin import StepContext
from memagent_jax.rl.scoring import Rewarder


class PolicyStep:
    """A DAPO step's batch (module docstring)."""

    def __init__(self, config, agent, runner, rewarder: Rewarder, plugin):
        self.config, self.agent, self.runner = config, agent, runner
        self.rewarder, self.plugin = rewarder, plugin

    def collect(self, params, iterator, context: StepContext, seed_for_try: Callable,
                on_call: Callable) -> RolloutBatch:
        starts = functools.partial(self.plugin.starts, context) if self.plugin else None
        return collect_batch(self.runner, self.agent, params, iterator, self.config,
                             self.rewarder, seed_for_try, on_call, starts)

    def groups(self, batch: RolloutBatch, context: StepContext,
               advantages: Callable[[np.ndarray], np.ndarray]) -> tuple[list, np.ndarray]:
        """(the trajectory groups to train on, their advantages [G, n])."""
        return batch.groups, advantages(batch.rewards)


class SupervisedStep:
    """A supervised step's batch (module docstring)."""

    def __init__(self, config, agent, plugin, rewarder: Rewarder):
        self.config, self.agent, self.plugin, self.rewarder = config, agent, plugin, rewarder

    def collect(self, params, iterator, context: StepContext, seed_for_try: Callable,
                on_call: Callable) -> RolloutBatch:
        return supervised_batch(iterator, self.config.prompts_per_step, self.rewarder,
                                functools.partial(self.plugin.target, self.agent))

    def groups(self, batch: RolloutBatch, context: StepContext,
               advantages: Callable[[np.ndarray], np.ndarray]) -> tuple[list, np.ndarray]:
        groups = batch.groups + [[t] for t in self.plugin.extra_trajectories(context)]
        return groups, np.ones(sum(len(g) for g in groups))


def make_step(config, agent, runner, rewarder: Rewarder, plugin
              ) -> PolicyStep | SupervisedStep:
    """The step `config.learner.loss` names (its objective, rl/objectives.py, says whether it
    samples)."""
    if OBJECTIVES[config.learner.loss].supervised:
        return SupervisedStep(config, agent, plugin, rewarder)
    return PolicyStep(config, agent, runner, rewarder, plugin)
