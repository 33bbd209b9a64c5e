"""The synthetic tests' shared fixtures, one of each a module: the supervised warm-up's random
model and its memory agent (tests/builders.py's SFT_MODEL and SFT_BUDGETS)."""

import pytest

from memagent_jax.agents.memagent.agent import build_agent
from memagent_jax.data.needle import write_tokenizer
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.models.loading import random_model
from memagent_jax.synthetic import tasks as synthetic
from memagent_jax.tokenizer import load_tokenizer
from tests.builders import SFT_BUDGETS, SFT_MODEL


@pytest.fixture(scope="module")
def sft_model():
    """A random SFT_MODEL (seed 0)."""
    return random_model(SFT_MODEL, seed=0)


@pytest.fixture(scope="module")
def agent(tmp_path_factory, sft_model):
    """`sft_model`'s memory agent with SFT_BUDGETS, the synthetic tasks' word tokenizer and 4
    decode slots."""
    tokenizer = load_tokenizer(write_tokenizer(str(tmp_path_factory.mktemp("tok")),
                                               synthetic.vocabulary()))
    return build_agent(sft_model, tokenizer, SFT_BUDGETS, EngineConfig(slots=4), None,
                       (tokenizer.eos_token_id,))
