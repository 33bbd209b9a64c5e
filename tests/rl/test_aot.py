"""Programs compiled from shapes only (`Learner.compiled`, `Engine.compiled`, what
benchmarks/aot.py reports for a config's chips): a learner built on ShapeDtypeStructs compiles
the same programs as one holding arrays, and nothing runs."""

import jax
import pytest

from memagent_jax.engine.engine import Engine
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.models.loading import abstract_params, build_model, random_model
from memagent_jax.models.presets import preset_config
from memagent_jax.models.sharding import make_mesh
from memagent_jax.rl.config import LearnerConfig
from memagent_jax.rl.learner import Learner

pytestmark = pytest.mark.slow  # a learner and an engine compiled twice

CONFIG = LearnerConfig(micro_batch_tokens=512, bucket_lengths=(64,), kl_coef=0.001)


def _memory(program):
    m = program.memory_analysis()
    return (m.argument_size_in_bytes, m.output_size_in_bytes, m.alias_size_in_bytes,
            m.temp_size_in_bytes)


def _flops(program):
    cost = program.cost_analysis()
    return (cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"]


def test_an_abstract_learner_and_engine_compile_what_real_ones_compile():
    shape = preset_config("tiny", dtype="float32")
    mesh = make_mesh({"data": 2, "fsdp": 4})
    abstract = build_model(shape, abstract_params(shape, mesh), dtype="float32")
    assert all(isinstance(x, jax.ShapeDtypeStruct)
               for x in jax.tree.leaves(Learner(abstract, CONFIG, mesh).state()["params"]))

    compiled = Learner(abstract, CONFIG, mesh).compiled(8, 64)
    real = Learner(random_model(shape, mesh=mesh), CONFIG, mesh).compiled(8, 64)
    assert compiled.keys() == real.keys() == {"train step", "log-probs"}
    for name in compiled:  # the same programs (their HLO differs only in source lines)
        assert _memory(compiled[name]) == _memory(real[name]), name
        assert _flops(compiled[name]) == _flops(real[name]) > 0, name
    # The train step donates parameters, optimiser state and gradient sums to its outputs.
    args, _, alias, _ = _memory(compiled["train step"])
    assert alias > 0.9 * args

    engine = Engine(abstract, EngineConfig(slots=4, max_len=128, prefill_buckets=(64,)), mesh)
    programs = engine.compiled()
    assert set(programs) == {"decode step", "decode step, ragged read", "prefill 1 x 64",
                             "prefill 1 x 128"}
    assert all(_memory(p)[0] > 0 for p in programs.values())

