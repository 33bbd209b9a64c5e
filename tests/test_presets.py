"""Preset shapes against REFERENCE.md section 6, and compile size independent of depth."""

import math

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from memagent_jax.models import Qwen2, preset_config
from memagent_jax.models.config import ModelConfig
from memagent_jax.models.qwen2 import param_specs

PUBLISHED_PARAMS = {  # billions, REFERENCE.md section 6
    "qwen2.5-0.5b": 0.49, "qwen2.5-1.5b": 1.54, "qwen2.5-3b": 3.09, "qwen2.5-7b": 7.62,
    "qwen2.5-14b": 14.8, "qwen2.5-32b": 32.8, "qwen2.5-72b": 72.7,
}


@pytest.mark.parametrize("name", list(PUBLISHED_PARAMS))
def test_preset_parameter_count_matches_published(name):
    config = preset_config(name)
    count = sum(math.prod(shape) for shape, _ in param_specs(config).values())
    assert abs(count / 1e9 - PUBLISHED_PARAMS[name]) <= 0.006 * PUBLISHED_PARAMS[name] + 0.005
    abstract = nnx.eval_shape(lambda: Qwen2(config, rngs=nnx.Rngs(0)))
    assert sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param))) == count


def _lowered_size(num_layers: int) -> int:
    config = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_layers=num_layers, num_heads=4, num_kv_heads=2, head_dim=8)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Qwen2(config, rngs=nnx.Rngs(0))))
    ids = jax.ShapeDtypeStruct((1, 16), jnp.int32)
    lowered = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)).lower(state, ids)
    return len(lowered.as_text())


def test_program_size_does_not_grow_with_depth():
    """The layers run in one scan: 48 layers lower to the same program as 2."""
    assert _lowered_size(48) <= 1.02 * _lowered_size(2)
