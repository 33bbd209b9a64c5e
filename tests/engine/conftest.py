"""The engine tests' shared fixtures, one of each a module: the tiny random Qwen2's
(`model_dir`, tests/conftest.py) transformers twin, the model loaded and its parameters."""

import pytest

from memagent_jax.models.loading import load_model
from memagent_jax.models.qwen import split_params
from tests.hf_reference import TINY_SEED, hf_model


@pytest.fixture(scope="module")
def reference():
    """transformers' Qwen2ForCausalLM with `model_dir`'s weights."""
    return hf_model(seed=TINY_SEED)


@pytest.fixture(scope="module")
def model(model_dir):
    """`model_dir`'s model, loaded."""
    return load_model(model_dir)[0]


@pytest.fixture(scope="module")
def params(model):
    """`model`'s parameters (the engine's and learner's argument)."""
    return split_params(model)[1]
