"""The blocked causal attention against the reference with an explicit causal mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memagent_jax.models.attention import attend, attend_causal


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


def test_no_square_score_tensor_is_built():
    """At T = 1024 with 128-blocks the compiled program holds no [.., 1024, 1024] buffer."""
    t = 1024
    q = jax.ShapeDtypeStruct((1, t, 4, 16), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, t, 2, 16), jnp.float32)
    hlo = jax.jit(attend_causal).lower(q, kv, kv).compile().as_text()
    assert "1024,1024]" not in hlo
    masked = jax.jit(attend).lower(q, kv, kv, jax.ShapeDtypeStruct((1, t, t), bool))
    assert "1024,1024]" in masked.compile().as_text()  # the check can see one when it exists
