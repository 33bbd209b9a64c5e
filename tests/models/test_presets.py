"""Preset shapes against docs/algorithm.md section 6, and which programs grow with depth."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from memagent_jax.models.config import ModelConfig
from memagent_jax.models.presets import preset_config, preset_hf_dict
from memagent_jax.models.qwen import KVCache, Qwen, param_specs

PUBLISHED_PARAMS = {  # billions, docs/algorithm.md section 6
    "qwen2.5-0.5b": 0.49, "qwen2.5-1.5b": 1.54, "qwen2.5-3b": 3.09, "qwen2.5-7b": 7.62,
    "qwen2.5-14b": 14.8, "qwen2.5-32b": 32.8, "qwen2.5-72b": 72.7,
}


# Qwen3 model cards: "Number of Parameters" and "(Non-Embedding)", in billions as printed
# (docs/algorithm.md section 6).
QWEN3_PUBLISHED = {
    "qwen3-0.6b": ("0.6", "0.44"), "qwen3-1.7b": ("1.7", "1.4"), "qwen3-4b": ("4.0", "3.6"),
    "qwen3-8b": ("8.2", "6.95"), "qwen3-14b": ("14.8", "13.2"), "qwen3-32b": ("32.8", "31.2"),
}


def _spec_count(config: ModelConfig) -> int:
    specs = jax.tree.leaves(param_specs(config),
                            is_leaf=lambda x: isinstance(x, tuple) and isinstance(x[0], tuple))
    return sum(math.prod(shape) for shape, _ in specs)


def _count(config: ModelConfig) -> int:
    """The parameter count `param_specs` gives, checked against the model's own parameters on
    two of the config's layers (tracing all 80 of a 72B takes half a minute)."""
    two_layers = dataclasses.replace(config, num_layers=2)
    abstract = nnx.eval_shape(lambda: Qwen(two_layers, rngs=nnx.Rngs(0)))
    assert (sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
            == _spec_count(two_layers))
    return _spec_count(config)


@pytest.mark.parametrize("name", list(PUBLISHED_PARAMS))
def test_preset_parameter_count_matches_published(name):
    count = _count(preset_config(name))
    assert abs(count / 1e9 - PUBLISHED_PARAMS[name]) <= 0.006 * PUBLISHED_PARAMS[name] + 0.005


@pytest.mark.parametrize("name", list(QWEN3_PUBLISHED))
def test_qwen3_preset_parameter_counts_round_to_the_model_card(name):
    """Both of a Qwen3 card's counts, total and without the embedding (and the untied LM
    head), round to the printed figure (head norms and no q/k/v biases included)."""
    config = preset_config(name)
    count = _count(config)
    embedding = config.vocab_size * config.hidden_size * (1 + config.untied)
    for printed, value in zip(QWEN3_PUBLISHED[name], (count, count - embedding)):
        half_unit = 0.5 * 10.0 ** -len(printed.partition(".")[2])
        assert abs(value / 1e9 - float(printed)) <= half_unit, (printed, value)


def _matmuls(num_layers: int, program: str) -> int:
    """dot_general ops in the lowered program: the layer code traced once or once per layer."""
    config = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_layers=num_layers, num_heads=4, num_kv_heads=2, head_dim=8)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Qwen(config, rngs=nnx.Rngs(0))))
    ids = jax.ShapeDtypeStruct((1, 16), jnp.int32)
    if program == "forward":
        lowered = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)).lower(state, ids)
    elif program == "prefill":
        last = jax.ShapeDtypeStruct((1,), jnp.int32)
        lowered = jax.jit(lambda s, x, i: nnx.merge(graphdef, s).prefill(x, i)).lower(
            state, ids, last)
    else:
        token = jax.ShapeDtypeStruct((1,), jnp.int32)
        cache = jax.eval_shape(lambda: KVCache.zeros(config, 1, 16))
        lowered = jax.jit(lambda s, t, c: nnx.merge(graphdef, s).decode_step(t, t, c)).lower(
            state, token, cache)
    return lowered.as_text().count("dot_general")


@pytest.mark.slow
def test_forward_traces_the_layer_once():
    """The full forward (the train step's) runs the layers in one scan: 48 layers lower to the
    same matmuls as 2, so its compile time does not grow with depth."""
    assert _matmuls(48, "forward") == _matmuls(2, "forward")


@pytest.mark.slow
@pytest.mark.parametrize("program", ["prefill", "decode"])
def test_engine_programs_run_each_layer_on_its_own_weights(program):
    """Prefill and decode are unrolled over the per-layer weights (no stacked slices to copy):
    their matmuls grow with depth, 9 per layer (q, k, v, o, gate, up, down, and the two
    attention products)."""
    assert _matmuls(6, program) - _matmuls(2, program) == 4 * 9


def test_a_qwen3_config_without_head_dim_reads_transformers_default():
    """Qwen3Config's head_dim defaults to 128, not hidden / heads (80 for the 4B shape)."""
    from transformers import Qwen3Config

    d = {k: v for k, v in preset_hf_dict("qwen3-4b").items() if k != "head_dim"}
    assert ModelConfig.from_hf_dict(d).head_dim == Qwen3Config(**d).head_dim == 128
