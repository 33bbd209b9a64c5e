"""The OpenAI-compatible server an evaluation with `model.url` asks (eval/methods.py's
AgentMethod, `method: memagent` or `agent`)."""

from __future__ import annotations

import os

from memagent_jax.eval.config import EvalConfig
from memagent_jax.rollout.client import Server, api_key_from_env


def server_of(config: EvalConfig) -> Server:
    """The server at `model.url`, asked for `model.served_name` (default: the last part of
    model.path) with the key in the environment, every call sampled as the `sampling` section
    says (temperature, top_p, top_k)."""
    model, s = config.model, config.sampling
    assert model.url is not None, "a config without model.url runs the local engine"
    name = model.served_name or os.path.basename(os.path.normpath(model.path or ""))
    return Server(model.url, name, api_key_from_env(), temperature=s.temperature,
                  top_p=s.top_p, top_k=s.top_k)
