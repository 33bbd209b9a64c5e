"""MemAgent (docs/algorithm.md section 1) as an agent package, the module an `agent` section
names (`agent: {module: memagent_jax.agents.memagent}`, the default): its settings
(`config.MemAgentConfig`, the `memagent` section), reading a document into chunks
(`reading`), the original's prompts (`templates`) and the agent (`agent.MemAgent`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memagent_jax.errors import ConfigError

if TYPE_CHECKING:  # the agent (and JAX) load when it is built, not with a config's settings
    from memagent_jax.agents.memagent.agent import MemAgent


def build(settings: dict, config) -> MemAgent:
    """The agent of `agent: {module: memagent_jax.agents.memagent}` (the default): its
    settings are the config's `memagent` section, so the `agent` section takes none."""
    from memagent_jax.agents.memagent.agent import MemAgent

    if settings:
        raise ConfigError(f"agent.{next(iter(settings))}", "MemAgent's settings are the "
                                                           "`memagent` section")
    return MemAgent(config.memagent)
