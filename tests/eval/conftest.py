"""The eval tests' shared fixture: the tiny random model an eval runs (read-only), one a
module."""

import pytest

from tests.hf_reference import write_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A tiny random Qwen2 (hf_reference.TINY, weights seeded 3) with the word-level
    tokenizer beside it."""
    return write_tiny_model(tmp_path_factory.mktemp("eval") / "m", seed=3)
