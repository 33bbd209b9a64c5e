"""The OpenAI-compatible server an evaluation with `model.url` asks, and the seeds it asks
for: one way for every method that runs on a server (`method: memagent`, eval/remote.py;
`method: agent`, eval/methods.py)."""

from __future__ import annotations

import os
import zlib

from memagent_jax.eval.config import EvalConfig, SamplingSection
from memagent_jax.rollout.client import Server, api_key_from_env


def server_of(config: EvalConfig) -> Server:
    """The server at `model.url`, asked for `model.served_name` (default: the last part of
    model.path) with the key in the environment, every call sampled as the `sampling` section
    says (temperature, top_p, top_k)."""
    model, s = config.model, config.sampling
    name = model.served_name or os.path.basename(os.path.normpath(model.path or ""))
    return Server(model.url, name, api_key_from_env(), temperature=s.temperature,
                  top_p=s.top_p, top_k=s.top_k)


def server_seeds(sampling: SamplingSection, set_name: str, batch: list[tuple[int, dict]]
                 ) -> list[list[int]]:
    """seeds[i][k]: the seed of trajectory k of the batch's row i, from (sampling.seed, set,
    row, k): a rerun asks the server for the same ones."""
    return [[zlib.crc32(f"{sampling.seed}/{set_name}/{row}/{k}".encode()) & 0x7FFFFFFF
             for k in range(sampling.n)] for row, _ in batch]
