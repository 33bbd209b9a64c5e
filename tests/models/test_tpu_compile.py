"""The TPU path compiles: libtpu (the test extra installs it; the default install does not)
compiles the learner's programs and the engine's prefill for a `v5p:2x2x1` topology from
shapes alone (this machine has no TPU), with splash attention lowered to its Mosaic kernel,
so a change that breaks TPU compilation fails here rather than on a pod."""

import os

import pytest

pytest.importorskip("libtpu", reason="libtpu is installed by the test extra (jax[tpu])")

from jax.experimental import topologies

from memagent_jax.engine.engine import Engine
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.models.loading import abstract_params, build_model
from memagent_jax.models.presets import preset_config
from memagent_jax.models.sharding import make_mesh
from memagent_jax.rl.config import LearnerConfig
from memagent_jax.rl.learner import Learner


@pytest.fixture(scope="module")
def tpu_mesh():
    # Compiling from shapes needs no chip to itself: without this, another process using
    # libtpu (benchmarks/aot.py, say) holds its lock file and the topology is refused.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    devices = topologies.get_topology_desc(platform="tpu", topology_name="v5p:2x2x1").devices
    assert len(devices) == 4 and devices[0].platform == "tpu"
    return make_mesh({"fsdp": 2, "tensor": 2}, devices=devices)


@pytest.mark.slow
def test_the_learner_and_the_prefill_compile_for_tpu_with_splash_attention(tpu_mesh):
    shape = preset_config("tiny").replace(dtype="float32")
    model = build_model(shape, abstract_params(shape, tpu_mesh), dtype="bfloat16",
                        attention="splash")
    learner = Learner(model, LearnerConfig(logit_chunk_tokens=128), tpu_mesh)
    compiled = learner.compiled(4, 256)
    copy = shape.replace(dtype="bfloat16")
    decoder = build_model(copy, abstract_params(copy, tpu_mesh), dtype="bfloat16",
                          attention="splash")
    engine = Engine(decoder, EngineConfig(slots=4, prefill_buckets=(256,), max_len=512),
                    tpu_mesh)
    compiled.update(engine.compiled())
    assert {"train step", "log-probs", "decode step", "decode step, ragged read",
            "prefill 1 x 256"} <= set(compiled)
    for name, program in compiled.items():
        memory = program.memory_analysis()
        assert memory.argument_size_in_bytes > 0, name
        uses_the_kernel = "tpu_custom_call" in program.as_text()
        # The dense decode step reads the KV cache with the XLA path whatever `attention`
        # says; the ragged one with its own kernel (models/cache_kernels.py).
        assert uses_the_kernel == (name != "decode step"), name
