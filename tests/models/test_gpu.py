"""Checks that need a CUDA GPU (skipped elsewhere, so CI, which has none, skips them): the
cuDNN flash-attention path (`attention="cudnn"`: the prefill, and the training forward and
gradient) against the XLA reference, and that the compiled programs really call cuDNN's fused
attention; packed rows under 'cudnn' (jax's Triton flash kernels, models/flash_gpu.py) against
the blocked XLA kernel; the Triton ragged cache read (models/cache_kernels.py) against the
dense read.

Run on a GPU machine with `JAX_PLATFORMS=cuda python -m pytest tests/models/test_gpu.py`
(conftest.py pins the rest of the suite to simulated CPU devices unless JAX_PLATFORMS is set).
Weights are random bf16 at the Qwen2.5-0.5B widths (head_dim 64, 14 query / 2 key-value heads)
and the Qwen3-0.6B ones (head norms, head_dim 128, 16 / 8 heads), with 2 layers; bf16 results
of two attention kernels differ by rounding, so the bounds are relative norms, not equality.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memagent_jax.engine.engine import Engine
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Request, complete
from memagent_jax.models.presets import preset_config
from memagent_jax.models.qwen import Qwen, split_params

pytestmark = pytest.mark.skipif(jax.devices()[0].platform not in ("gpu", "cuda"),
                                reason="needs a CUDA GPU")


@pytest.fixture(params=["qwen2.5-0.5b", "qwen3-0.6b"])
def config(request):
    return preset_config(request.param, dtype="bfloat16").replace(num_layers=2)


def model(config, attention: str) -> Qwen:
    # The same seed gives the same weights whatever the attention implementation.
    return Qwen(config, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, attention=attention,
                rngs=nnx.Rngs(0))


def relative_error(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def prefill(m: Qwen, ids: jnp.ndarray):
    return m.prefill(ids, jnp.full(ids.shape[:1], ids.shape[1] - 1))


@pytest.mark.parametrize("length", [256, 2048])
def test_cudnn_prefill_matches_xla(config, length):
    ids = jax.random.randint(jax.random.PRNGKey(length), (2, length), 0, config.vocab_size)
    logits, keys, _ = nnx.jit(prefill)(model(config, "cudnn"), ids)
    ref_logits, ref_keys, _ = nnx.jit(prefill)(model(config, "xla"), ids)
    assert np.isfinite(np.asarray(logits)).all()
    assert relative_error(logits, ref_logits) < 2e-2
    assert relative_error(keys[0], ref_keys[0]) < 2e-2


def test_cudnn_is_in_the_compiled_prefill(config):
    ids = jnp.zeros((1, 512), jnp.int32)
    hlo = nnx.jit(prefill).lower(model(config, "cudnn"), ids).compile().as_text()
    assert "cudnn" in hlo.lower() and "fmha" in hlo.lower()
    ref = nnx.jit(prefill).lower(model(config, "xla"), ids).compile().as_text()
    assert "fmha" not in ref.lower()


def test_cudnn_training_gradient_matches_xla(config):
    """The unmasked forward (what the learner differentiates) takes cuDNN's fused attention in
    its gradient too, and the gradient agrees with the blocked XLA kernel's."""
    ids = jax.random.randint(jax.random.PRNGKey(1), (2, 1024), 0, config.vocab_size)
    grads, hlo = {}, {}
    for attention in ("cudnn", "xla"):
        graphdef, state = nnx.split(model(config, attention))
        loss = lambda state: jnp.mean(nnx.merge(graphdef, state)(ids)[:, :, :64] ** 2)  # noqa: B023 - used in this iteration
        grad = jax.jit(jax.grad(loss))
        hlo[attention] = grad.lower(state).compile().as_text().lower()
        grads[attention] = jax.tree.leaves(grad(state))
    assert "fmha" in hlo["cudnn"] and "fmha" not in hlo["xla"]
    for fused, ref in zip(grads["cudnn"], grads["xla"], strict=True):
        assert relative_error(fused, ref) < 5e-2


def test_cudnn_packed_training_gradient_matches_xla(config):
    """Packed rows under attention 'cudnn' (segment ids: jax's Triton flash kernels,
    models/flash_gpu.py, forward and backward) against the blocked XLA kernel with the same
    segments, in float32 (in bf16 a random 2-layer model's small gradients are mostly
    rounding): the hidden states and the gradient agree (Triton's dots may run in TF32), and
    the compiled gradient runs Triton."""
    config = config.replace(dtype="float32")
    ids = jax.random.randint(jax.random.PRNGKey(2), (2, 1000), 0, config.vocab_size)
    segments = jnp.asarray([np.repeat([1, 2, 3], [400, 350, 250]),
                            np.repeat([1, 2, 0], [700, 200, 100])], jnp.int32)
    grads, hidden, hlo = {}, {}, {}
    for attention in ("cudnn", "xla"):
        graphdef, state = nnx.split(Qwen(config, dtype=jnp.float32, param_dtype=jnp.float32,
                                         attention=attention, rngs=nnx.Rngs(0)))

        def loss(state):
            out = nnx.merge(graphdef, state).hidden(ids, segment_ids=segments)  # noqa: B023 - used in this iteration
            return jnp.mean(out ** 2), out

        grad = jax.jit(jax.grad(loss, has_aux=True))
        hlo[attention] = grad.lower(state).compile().as_text().lower()
        found, hidden[attention] = grad(state)
        grads[attention] = jax.tree.leaves(found)
    assert "triton" in hlo["cudnn"] and "triton" not in hlo["xla"]
    assert relative_error(hidden["cudnn"], hidden["xla"]) < 1e-2
    for fused, ref in zip(grads["cudnn"], grads["xla"], strict=True):
        assert relative_error(fused, ref) < 2e-2


def test_cudnn_engine_greedy_matches_xla(config):
    """Prefill + decode steps through the engine: the first greedy token of every prompt is
    the same, and the log-probabilities agree up to where the two greedy paths part (a bf16
    near-tie can flip a later token)."""
    rng = np.random.default_rng(0)
    requests = [Request(tuple(rng.integers(0, config.vocab_size, n).tolist()),
                        max_new_tokens=16, sampling=SamplingParams(temperature=0.0, seed=0))
                for n in (5, 100, 300, 700)]
    outs = {}
    for attention in ("cudnn", "xla"):
        loaded = model(config, attention)
        engine = Engine(loaded, EngineConfig(slots=2, max_len=1024))
        outs[attention] = [r[0] for r in complete(engine, split_params(loaded)[1], requests)]
    for fused, ref in zip(outs["cudnn"], outs["xla"]):
        assert fused.token_ids[0] == ref.token_ids[0]
        same = 0
        while same < len(ref.token_ids) and fused.token_ids[same] == ref.token_ids[same]:
            same += 1
        np.testing.assert_allclose(fused.logprobs[:same], ref.logprobs[:same], atol=0.1)


@pytest.mark.parametrize("head_dim, heads", [(128, (28, 4)), (64, (14, 2))])
def test_ragged_kernel_matches_the_dense_read_on_gpu(head_dim, heads):
    """The Triton ragged cache read (models/cache_kernels.py), compiled, against the
    length-masked dense read (`attend_cache`) on the same bf16 cache: 8 slots of lengths 1 to
    8448 (one partial block) at the 7B configs' longest cache."""
    from memagent_jax.models.attention import attend_cache
    from memagent_jax.models.cache_kernels import attend_cache_ragged_gpu

    hq, hkv = heads
    s = 8448
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal(shape), jnp.bfloat16) for shape in
               ((8, 1, hq, head_dim), (8, hkv, head_dim, s), (8, hkv, s, head_dim)))
    lengths = jnp.array([1, 63, 64, 65, 1000, 4097, 8000, s], jnp.int32)
    visible = (jnp.arange(s)[None, None] < lengths[:, None, None])
    expected = jax.jit(attend_cache)(q, k, v, visible)
    got = jax.jit(attend_cache_ragged_gpu)(q, k, v, lengths)
    assert relative_error(got, expected) < 1e-2
