"""The serve tests' shared fixture: the served tiny model (tests/serve_helpers.py), one a module."""

import pytest

from tests.serve_helpers import tiny_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random Qwen2 with the word-level tokenizer (serve_helpers.tiny_model_dir)."""
    return tiny_model_dir(tmp_path_factory)
