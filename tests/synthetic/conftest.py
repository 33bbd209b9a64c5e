"""The synthetic tests' shared fixtures, one of each a module: the supervised warm-up's random
model, its memory agent and where the agent runs on it (tests/builders.py's SFT_MODEL and
SFT_BUDGETS)."""

import pytest

from memagent_jax.agents.memagent.agent import MemAgent
from memagent_jax.data.needle import write_tokenizer
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.models.loading import random_model
from memagent_jax.models.qwen import split_params
from memagent_jax.rollout.runner import build_runner
from memagent_jax.synthetic import tasks as synthetic
from memagent_jax.tokenizer import load_tokenizer
from tests.builders import SFT_BUDGETS, SFT_MODEL


@pytest.fixture(scope="module")
def sft_model():
    """A random SFT_MODEL (seed 0)."""
    return random_model(SFT_MODEL, seed=0)


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    """The memory agent with SFT_BUDGETS and the synthetic tasks' word tokenizer."""
    tokenizer = load_tokenizer(write_tokenizer(str(tmp_path_factory.mktemp("tok")),
                                               synthetic.vocabulary()))
    return MemAgent(SFT_BUDGETS, tokenizer, (tokenizer.eos_token_id,))


@pytest.fixture(scope="module")
def rollouts(agent, sft_model):
    """`agent` on `sft_model` (its own parameters), 4 decode slots."""
    return build_runner(agent, sft_model, agent.tokenizer, EngineConfig(slots=4), None,
                        agent.stop_ids).with_params(split_params(sft_model)[1])
