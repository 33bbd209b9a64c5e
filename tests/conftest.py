"""Test set-up: 8 simulated CPU devices (set before JAX is imported) and the small fixtures
that tests in more than one folder use (a folder's own are in its conftest.py)."""

import atexit
import contextlib
import os
import shutil
import tempfile

from tests import multiprocess  # standard library only: JAX is not imported yet

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA's compiled programs, shared by every test and every process a test starts (they inherit
# the environment): the tests build the same small models again and again, each time with new
# jitted functions, and a job started as a process compiles what the jobs before it compiled.
# Compiling is most of many tests' time.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="memagent-jax-tests-xla-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# The CPU's compile flags on CPU only: a GPU run (tests/models/test_gpu.py) compiles as usual.
cpu_only = multiprocess.COMPILE_FLAGS if os.environ["JAX_PLATFORMS"] == "cpu" else ""
os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS"), cpu_only,
                                                "--xla_force_host_platform_device_count=8"]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from memagent_jax.distributed.startup import reserve_cpu_threads

reserve_cpu_threads()  # the 8 devices' thread pool; before JAX starts its CPU backend

import pytest

from memagent_jax.tokenizer import load_tokenizer
from tests.hf_reference import TINY_SEED, write_tiny_model, write_tiny_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A tiny random Qwen2 (hf_reference.TINY, weights seeded TINY_SEED, a context window of
    512 tokens) with the word-level tokenizer beside it, so commands take text (engine,
    rollout); read-only."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=TINY_SEED)


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory):
    """hf_reference.write_tiny_tokenizer's word-level tokenizer (no thinking), loaded: unknown
    words read as [UNK] (rollout, serve)."""
    path = tmp_path_factory.mktemp("words")
    write_tiny_tokenizer(path)
    return load_tokenizer(str(path))


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
    `counter.count`, those the persistent cache answers included (JAX records a backend
    compile for them too)."""
    return _counting_compilations


@pytest.fixture(scope="module")
def model(model_dir):
    """`model_dir`'s model, loaded."""
    from memagent_jax.models.loading import load_model

    return load_model(model_dir)[0]


@pytest.fixture(scope="module")
def params(model):
    """`model`'s parameters (the engine's and learner's argument)."""
    from memagent_jax.models.qwen import split_params

    return split_params(model)[1]
