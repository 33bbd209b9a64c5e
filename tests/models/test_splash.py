"""Splash attention (TPU's Pallas kernel, run here in interpret mode) against the reference
with an explicit mask: causal grouped-query attention over right-padded rows, forward and
gradient, on one device and inside shard_map on 8 simulated devices; and the model with
`attention: splash` against the model with the blocked XLA kernel."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from memagent_jax.models.attention import attend
from memagent_jax.models.loading import random_model
from memagent_jax.models.presets import preset_config
from memagent_jax.models.sharding import make_mesh
from memagent_jax.models.splash import splash_causal

pytestmark = [pytest.mark.filterwarnings("ignore:attention 'splash' off TPU"),
              pytest.mark.slow]  # the splash kernel in interpret mode


def _inputs(rows, t, hq, hkv, lengths, seed):
    """q, k, v [rows, t, H, 16] and loss weights that are 0 at each row's padding."""
    r = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(r.standard_normal((rows, t, h, 16)), jnp.float32)
               for h in (hq, hkv, hkv))
    real = np.arange(t)[None, :] < np.asarray(lengths)[:, None]  # [rows, t]
    weights = jnp.asarray(r.standard_normal((rows, t, hq, 16)) * real[:, :, None, None],
                          jnp.float32)
    return q, k, v, weights, jnp.asarray(real)


def _value_and_grads(attention, q, k, v, weights):
    def loss(q, k, v):
        out = attention(q, k, v)
        return jnp.sum(out * weights), out
    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return out, grads


def _check(q, k, v, weights, real, attention):
    t = q.shape[1]
    visible = jnp.tril(jnp.ones((t, t), bool))[None] & real[:, None, :]
    expected, expected_grads = _value_and_grads(lambda q, k, v: attend(q, k, v, visible),
                                                q, k, v, weights)
    got, grads = _value_and_grads(attention, q, k, v, weights)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    at_tokens = np.asarray(real)[:, :, None, None]
    assert np.abs(np.asarray(got - expected) * at_tokens).max() <= 1e-5
    scale = max(float(jnp.abs(g).max()) for g in expected_grads)
    for g, e in zip(grads, expected_grads):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-5, atol=1e-6 * scale)


@pytest.mark.parametrize("heads", [(4, 2), (6, 1), (4, 4)])
def test_splash_equals_the_masked_reference_on_right_padded_rows(heads):
    """200 positions (the kernel pads to 256), rows of 200 and 77 real tokens."""
    q, k, v, weights, real = _inputs(2, 200, *heads, lengths=[200, 77], seed=sum(heads))
    _check(q, k, v, weights, real, splash_causal)


@pytest.mark.parametrize("axes, rows, heads", [
    ({"data": 2, "fsdp": 2, "tensor": 2}, 8, (4, 2)),  # rows over data x fsdp, heads over tensor
    ({"fsdp": 2, "tensor": 4}, 4, (8, 2)),  # 2 KV heads over tensor 4: heads replicated
    ({"fsdp": 8}, 4, (4, 2)),               # 4 rows over fsdp 8: rows replicated
])
def test_splash_in_shard_map_equals_the_masked_reference(axes, rows, heads):
    mesh = make_mesh(axes)
    lengths = [130 - 17 * i for i in range(rows)]
    q, k, v, weights, real = _inputs(rows, 130, *heads, lengths=lengths, seed=rows)
    spec = NamedSharding(mesh, PartitionSpec(("data", "fsdp"), None, "tensor", None))
    if "data" in axes:  # the first case's arrays arrive split as the model's would be
        q, k, v, weights = jax.device_put((q, k, v, weights), spec)
    _check(q, k, v, weights, real, lambda q, k, v: splash_causal(q, k, v, mesh=mesh))


def test_splash_off_tpu_says_it_is_interpret_mode():
    q, k, v, _, _ = _inputs(1, 8, 2, 1, lengths=[8], seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        splash_causal(q, k, v)
    assert any("interpret mode" in str(w.message) for w in caught)


def test_a_model_with_splash_attention_equals_the_blocked_kernel_and_its_gradient():
    """Qwen (tiny preset, 8 devices {data 2, fsdp 2, tensor 2}): logits, and the gradient of
    a loss through the rematerialised layer scan, as with attention 'xla'."""
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    config = preset_config("tiny").replace(dtype="float32")
    xla = random_model(config, seed=3, mesh=mesh)
    splash = random_model(config, seed=3, attention="splash", mesh=mesh)
    assert splash.mesh == mesh
    ids = jax.random.randint(jax.random.PRNGKey(0), (8, 150), 0, config.vocab_size)

    def loss(model):
        logits = model(ids, remat="full")
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1)), logits

    from flax import nnx
    results = [nnx.jit(nnx.value_and_grad(loss, has_aux=True))(m) for m in (xla, splash)]
    (_, logits_xla), grads_xla = results[0]
    (_, logits_splash), grads_splash = results[1]
    assert float(jnp.abs(logits_splash - logits_xla).max()) <= 1e-5
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(nnx.state(grads_splash)),
                            jax.tree.leaves(nnx.state(grads_xla))):
        scale = float(jnp.abs(b).max())
        assert float(jnp.abs(a - b).max()) <= 1e-5 * max(scale, 1e-3), path
