"""The serve tests' shared fixtures: the served tiny model (tests/serve_helpers.py) and its
thinking twin, one of each a module."""

import pytest

from tests.serve_helpers import tiny_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random Qwen2 with the word-level tokenizer (serve_helpers.tiny_model_dir)."""
    return tiny_model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def thinking_model_dir(tmp_path_factory):
    """`model_dir`'s weights with the Qwen3-like tokenizer: its chat template holds an empty
    think block when enable_thinking is false."""
    return tiny_model_dir(tmp_path_factory, thinking=True)
