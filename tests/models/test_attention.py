"""The blocked causal attention (and its hand-written gradient) against the reference with an
explicit causal mask; the ragged decode attention against the cache reference with a length
mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memagent_jax.models.attention import attend, attend_cache, attend_cache_ragged, attend_causal
from tests.builders import decode_cache, length_mask

pytestmark = pytest.mark.slow  # attention compiled at many shapes, forward and gradient


@pytest.mark.parametrize("t, block", [(1, 4), (7, 4), (16, 4), (37, 8), (64, 128)])
@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (7, 1)])
def test_blocked_equals_masked_reference(t, block, heads):
    hq, hkv = heads
    r = np.random.default_rng(t * 100 + block + hq)
    q, k, v = (jnp.asarray(r.standard_normal((2, t, h, 8)) * 2, jnp.float32)
               for h in (hq, hkv, hkv))
    causal = jnp.tril(jnp.ones((t, t), bool))[None].repeat(2, axis=0)
    expected = attend(q, k, v, causal)
    got = jax.jit(attend_causal, static_argnums=3)(q, k, v, block)
    assert got.shape == expected.shape
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5, rtol=1e-5)


def _inputs(t, hq, hkv, seed, dtype=jnp.float32):
    r = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(r.standard_normal((2, t, h, 8)) * 2, dtype) for h in (hq, hkv, hkv))
    weights = jnp.asarray(r.standard_normal((2, t, hq, 8)), dtype)  # a loss every output feeds
    return q, k, v, weights


def _grads(attention, q, k, v, weights):
    loss = lambda q, k, v: jnp.sum(attention(q, k, v).astype(jnp.float32) * weights)
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)


@pytest.mark.parametrize("t, block", [(1, 4), (5, 8), (37, 8), (64, 16)])
@pytest.mark.parametrize("heads", [(7, 1), (4, 4)])
def test_gradient_equals_masked_reference(t, block, heads):
    """T not a multiple of the block, T < block, grouped and plain heads; under jit."""
    q, k, v, weights = _inputs(t, *heads, seed=t + block)
    causal = jnp.tril(jnp.ones((t, t), bool))[None].repeat(2, axis=0)
    expected = _grads(lambda q, k, v: attend(q, k, v, causal), q, k, v, weights)
    got = _grads(lambda q, k, v: attend_causal(q, k, v, block), q, k, v, weights)
    # Absolute slack at float32 rounding of the gradients' scale: at T = 1 dq and dk are 0 in
    # exact arithmetic, and softmax(x) - 1 rounds differently along the two paths.
    scale = max(float(jnp.abs(g).max()) for g in expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-5, atol=1e-6 * scale)


def test_bfloat16_gradient_keeps_dtypes_and_tracks_float32():
    q, k, v, weights = _inputs(37, 6, 2, seed=1)
    grads32 = _grads(lambda q, k, v: attend_causal(q, k, v, 8), q, k, v, weights)
    bf16 = [x.astype(jnp.bfloat16) for x in (q, k, v, weights)]
    grads16 = _grads(lambda q, k, v: attend_causal(q, k, v, 8), *bf16)
    for g16, g32 in zip(grads16, grads32):
        assert g16.dtype == jnp.bfloat16
        scale = float(jnp.abs(g32).max())
        np.testing.assert_allclose(np.asarray(g16, np.float32), np.asarray(g32), atol=0.03 * scale)


def test_no_square_score_tensor_is_built():
    """At T = 1024 with the default blocks the compiled program holds no [.., 1024, 1024]
    buffer, nor does its gradient (which saves only q, k, v, the output and a log-sum-exp per
    row)."""
    t = 1024
    q = jax.ShapeDtypeStruct((1, t, 4, 16), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, t, 2, 16), jnp.float32)
    hlo = jax.jit(attend_causal).lower(q, kv, kv).compile().as_text()
    assert "1024,1024]" not in hlo
    loss = lambda q, k, v: jnp.sum(attend_causal(q, k, v))
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv).compile().as_text()
    assert "1024,1024]" not in grad
    masked = jax.jit(attend).lower(q, kv, kv, jax.ShapeDtypeStruct((1, t, t), bool))
    assert "1024,1024]" in masked.compile().as_text()  # the check can see one when it exists


_ragged = jax.jit(attend_cache_ragged, static_argnums=4)
_dense = jax.jit(attend_cache)


# One batch holds lengths 1, one block, block + 1, two blocks, S, and (S not a multiple of
# the block) one in the last, clamped block; then S a multiple of the block with T > 1, a
# block larger than S, and a block of realistic size.
@pytest.mark.parametrize("lengths, s, block, t, heads", [
    ([1, 8, 9, 16, 25, 30], 30, 8, 1, (2, 2)),
    ([1, 8, 9, 16, 25, 30], 30, 8, 1, (8, 2)),
    ([32, 9, 1], 32, 8, 3, (8, 2)),
    ([5, 1, 3], 5, 8, 2, (2, 2)),
    ([1, 256, 257, 300], 300, 256, 1, (8, 2)),
])
def test_ragged_cache_equals_length_masked_reference(lengths, s, block, t, heads):
    q, k, v, lengths = decode_cache(lengths, s, t, *heads, seed=s + block + t + heads[0])
    expected = _dense(q, k, v, length_mask(lengths, t, s))
    got = _ragged(q, k, v, lengths, block)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5, rtol=0)


def test_ragged_cache_bfloat16_tracks_float32():
    q, k, v, lengths = decode_cache([1, 8, 9, 16, 25, 30], 30, 1, 8, 2, seed=3)
    expected = _dense(q, k, v, length_mask(lengths, 1, 30))
    got = _ragged(*(x.astype(jnp.bfloat16) for x in (q, k, v)), lengths, 8)
    assert got.dtype == jnp.bfloat16
    scale = float(jnp.abs(expected).max())
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(expected),
                               atol=0.03 * scale, rtol=0)


def test_ragged_cache_reads_nothing_past_a_row_length():
    """NaN in every key and value at or past a row's length (the last block's tail, whole
    blocks after it; a clamped last block's overlap with the block before stays clean): the
    output is finite and equals the clean one. The dense path reads them all, and a masked
    key's probability 0 times a NaN value is NaN, so its output is NaN for every row shorter
    than S."""
    s, t = 30, 1
    q, k, v, lengths = decode_cache([1, 8, 9, 16, 25, 30], s, t, 8, 2, seed=5)
    past = jnp.arange(s)[None, None] >= lengths[:, None, None]  # [B, 1, S]
    k_nan = jnp.where(past[:, :, None, :], jnp.nan, k)
    v_nan = jnp.where(past[..., None], jnp.nan, v)
    clean = _ragged(q, k, v, lengths, 8)
    got = _ragged(q, k_nan, v_nan, lengths, 8)
    assert bool(jnp.isfinite(got).all())
    np.testing.assert_array_equal(np.asarray(got), np.asarray(clean))
    mask = length_mask(lengths, t, s)
    np.testing.assert_allclose(np.asarray(got), np.asarray(_dense(q, k, v, mask)), atol=1e-5,
                               rtol=0)
    dense = _dense(q, k_nan, v_nan, mask)
    assert bool(jnp.isnan(dense[:5]).all()) and bool(jnp.isfinite(dense[5]).all())
