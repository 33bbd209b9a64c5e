"""The trainer's plugin door: what an experiment may add to training steps, declared once.

The core trainer knows no task. A run whose config has a `plugin` section names a module in
`plugin.module`; the module's `build(settings, config)` parses the section's other keys (its
own schema, checked against the rest of the TrainConfig; errors are `ConfigError`s naming
`plugin.KEY`) and returns a `Plugin`, built once, by the trainer's build step (rl/build.py).
The trainer then asks it, each step, for what the experiment adds:
- a supervised step (`learner.loss: sft`) trains on `target(agent, example)`, one trajectory
  per drawn example, instead of sampled rollouts, and on `extra_trajectories(step)` beside
  them;
- a DAPO step rolls out `starts(step)`'s prompts, which come with their own rows (whatever
  the agent's `rollout` reads: for MemAgent a `Sample`, a read that begins inside a document
  from a given memory), in place of as many drawn ones;
- a validation read adds `validation_metrics(agent, examples, groups)` to the trainer's own
  (`val/NAME`): what only the experiment can score, such as how its documents' facts fare.
A step's `StepContext` gives the plugin what it may use: the agent, a seed, and the current
parameters through `logprobs` (teacher-forced rows scored) and `rollouts` (the rollout contract
on the step's runner: the agent run on given rows), so that a plugin can pick its rows by what
the policy does now without holding parameters or an engine of its own.
The synthetic tasks' plugin (`memagent_jax.synthetic.plugin`: their supervised warm-up, carry
starts, and the per-turn loss rate of a needed fact in validation) is the one shipped beside
the lookup experiment's (`memagent_jax.lookup.plugin`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import numpy as np

from memagent_jax.data.pipeline import Example
from memagent_jax.errors import ConfigError
from memagent_jax.rl.rows import TrainingRows
from memagent_jax.rollout.agent_api import Trajectory, section_module
from memagent_jax.rollout.rollouts import OnCall, Rollouts

SECTION = "plugin"


@dataclasses.dataclass(frozen=True)
class StepContext:
    """What a plugin may use in one step. agent: the config's agent (MemAgent
    for the synthetic plugin); seed: a function of (run seed, step) only, so that a
    resumed run draws the same rows; logprobs: rows -> [R, T] float32 log-probabilities of
    their response tokens under the current parameters (0 elsewhere); rollouts: the rollout
    contract (rollout/rollouts.py) on the step's own runner under the current parameters:
    `rollouts.run(agent, rows, sampling, on_call=step.on_call)` runs the agent on `rows` (whatever
    its `rollout` reads), sampled with `sampling` and nothing else (no call may
    change it), each call seeded from its seed as the step's rollouts are
    (`rollout.runner.call_seed`): the same parameters, rows and seed give the same
    trajectories; on_call: the step's, through which a stop (SIGTERM, Ctrl-C) ends a run as it
    ends the step's."""
    agent: object
    seed: int
    logprobs: Callable[[TrainingRows], np.ndarray]
    rollouts: Rollouts
    on_call: OnCall | None = None


class Plugin(Protocol):
    """An experiment's additions to a training step (module docstring)."""

    def target(self, agent, example: Example) -> Trajectory:
        """The trajectory a supervised step trains on for `example` (its turns' prompts as
        `agent` builds them, the replies the ones to learn)."""

    def extra_trajectories(self, step: StepContext) -> list[Trajectory]:
        """Trajectories a supervised step trains on beside its examples' targets."""

    def starts(self, step: StepContext) -> tuple[list[Example], list]:
        """Prompts a DAPO step rolls out in its first round in place of as many drawn ones:
        their examples (to score the answers against) and their rows (what the agent's
        `rollout` reads, one an example)."""

    def validation_metrics(self, agent, examples: list[Example],
                           groups: list[list[Trajectory]]) -> dict[str, float]:
        """Metrics of a validation read (the validation examples, [n] trajectories each),
        logged beside the trainer's as `val/NAME`; {} for none."""


def load(config) -> Plugin | None:
    """The plugin the TrainConfig's `plugin` section names, built from the section's other keys
    (None: no section)."""
    section = config.plugin
    if not section:
        return None
    name = section.get("module")
    module = section_module(SECTION, name, "build(settings, config), e.g. "
                                           "memagent_jax.synthetic.plugin")
    if not callable(getattr(module, "build", None)):
        raise ConfigError(f"{SECTION}.module", f"module {name!r} has no build(settings, config)")
    return module.build({k: v for k, v in section.items() if k != "module"}, config)
