"""The serve tests' own fixture: the served tiny model's (`model_dir`, tests/conftest.py)
thinking twin, one a module."""

import pytest

from tests.serve_helpers import tiny_model_dir


@pytest.fixture(scope="module")
def thinking_model_dir(tmp_path_factory):
    """`model_dir`'s weights with the Qwen3-like tokenizer: its chat template holds an empty
    think block when enable_thinking is false."""
    return tiny_model_dir(tmp_path_factory, thinking=True)
