"""The rollout tests' shared fixtures, one of each a module: the tiny random Qwen2 the engine
and command tests run (with the word-level tokenizer, so commands take text), its
transformers twin, the model loaded and its parameters."""

import pytest

from memagent_jax.models.loading import load_model
from memagent_jax.models.qwen import split_params
from tests.hf_reference import hf_model, write_tiny_model

SEED = 12  # the tiny model's weights: `reference` is built from the same seed


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A tiny random Qwen2 (hf_reference.TINY, weights seeded SEED, a context window of 512
    tokens) with the word-level tokenizer beside it; read-only."""
    return write_tiny_model(tmp_path_factory.mktemp("rollout") / "m", seed=SEED)


@pytest.fixture(scope="module")
def reference():
    """transformers' Qwen2ForCausalLM with `model_dir`'s weights."""
    return hf_model(seed=SEED)


@pytest.fixture(scope="module")
def model(model_dir):
    """`model_dir`'s model, loaded."""
    return load_model(model_dir)[0]


@pytest.fixture(scope="module")
def params(model):
    """`model`'s parameters (the engine's and learner's argument)."""
    return split_params(model)[1]
