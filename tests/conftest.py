"""Test set-up: 8 simulated CPU devices (set before JAX is imported) and small shared fixtures."""

import contextlib
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

from tests.hf_reference import write_hf_model  # noqa: E402


@pytest.fixture
def tiny_hf_dir(tmp_path):
    """An HF directory holding a tiny random Qwen2 (float32, untied); returns its path."""
    return write_hf_model(tmp_path / "hf", seed=0)


class _CompileCounter:
    def __init__(self):
        self.count = 0

    def __call__(self, event, duration, **kwargs):
        self.count += event == "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def _counting_compilations():
    import jax.monitoring
    counter = _CompileCounter()
    jax.monitoring.register_event_duration_secs_listener(counter)
    try:
        yield counter
    finally:
        jax.monitoring.unregister_event_duration_listener(counter)


@pytest.fixture
def compilations():
    """`with compilations() as counter: ...` counts XLA compilations inside the block in
    `counter.count`."""
    return _counting_compilations
