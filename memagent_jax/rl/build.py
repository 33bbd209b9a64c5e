"""What a train config names, built: its agent and its plugin (`build_run`), the trainer's
first step after the config's own checks, before any data is read or device touched.

The config (rl/config.py) is plain data. Here the agent's and the plugin's modules are
imported and built from their sections (`rollout.agent_api.load_agent`, `rl.plugin.load`,
each checking its section's keys), once per run, and what spans them and the config is
checked:
- the step kind `learner.loss` names (rl/steps.py) has what it needs (a supervised step: a
  plugin);
- with `overlong` on, the buffer fits the agent's smallest reply cap, where the agent names
  its caps (`reply_caps()`, an optional member of the agent interface).
Errors name the key, after the config's file where it was loaded from one
(`runconfig.located`), as the schema's own checks do.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from memagent_jax.errors import ConfigError
from memagent_jax.rl.config import TrainConfig
from memagent_jax.rl.plugin import Plugin
from memagent_jax.rl.plugin import load as load_plugin
from memagent_jax.rl.steps import STEP_KINDS
from memagent_jax.rollout.agent_api import load_agent
from memagent_jax.runconfig import located


@dataclasses.dataclass(frozen=True)
class Run:
    """A train config's live parts: the agent its `agent` section names (MemAgent where it
    names none) and the plugin its `plugin` section names (None: no section)."""
    agent: Any
    plugin: Plugin | None


def build_run(config: TrainConfig) -> Run:
    """The agent and plugin `config` names, checked against it (module docstring)."""
    with located(config):
        agent = load_agent(config.agent, config)
        plugin = load_plugin(config)
        needs = STEP_KINDS[config.learner.loss].needs_plugin
        if needs and plugin is None:
            raise ConfigError("learner.loss", f"{needs}: set plugin.module (e.g. "
                                              "memagent_jax.synthetic.plugin)")
        caps = agent.reply_caps() if hasattr(agent, "reply_caps") else {}
        if config.overlong.enabled and caps:
            key = min(caps, key=caps.__getitem__)
            if not 1 <= config.overlong.buffer <= caps[key]:
                raise ConfigError("overlong.buffer", f"must be in 1..{caps[key]} (the agent's "
                                                     f"smallest reply cap, {key}), got "
                                                     f"{config.overlong.buffer}")
    return Run(agent, plugin)
