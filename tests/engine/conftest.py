"""The engine tests' shared fixture, one a module: the tiny random Qwen2's (`model_dir`,
tests/conftest.py) transformers twin."""

import pytest

from tests.hf_reference import TINY_SEED, hf_model


@pytest.fixture(scope="module")
def reference():
    """transformers' Qwen2ForCausalLM with `model_dir`'s weights."""
    return hf_model(seed=TINY_SEED)
