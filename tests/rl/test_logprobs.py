"""Token log-probabilities a chunk of positions at a time (rl/logprobs.py): the same values and
gradients as the whole [B, T, V] logits, and a gradient that never holds them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memagent_jax.rl.logprobs import token_logprobs

pytestmark = pytest.mark.slow  # log-probabilities and gradients compiled in chunks


def _reference(hidden, head, tokens):
    """log_softmax over the whole [B, T, V]: log p of each next token, and the entropy."""
    logp_all = jax.nn.log_softmax(hidden[:, :-1] @ head / 0.7, axis=-1)
    picked = jnp.take_along_axis(logp_all, tokens[:, 1:, None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    return jnp.pad(picked, ((0, 0), (1, 0))), jnp.pad(entropy, ((0, 0), (1, 0)))


def _objective(chunk):
    def f(hidden, head, tokens, weights):
        logp, entropy = token_logprobs(lambda h: h @ head / 0.7, hidden, tokens, chunk)
        return jnp.sum(weights * logp) + 0.3 * jnp.sum(weights * entropy)
    return f


@pytest.mark.parametrize("chunk", [None, 1, 4, 10, 64])
def test_chunks_give_the_values_and_gradients_of_the_whole_logits(chunk):
    rng = np.random.default_rng(0)
    hidden = jnp.asarray(rng.normal(size=(3, 11, 8)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(8, 37)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, 37, (3, 11)), jnp.int32)
    weights = jnp.asarray(rng.uniform(size=(3, 11)), jnp.float32)
    logp, entropy = token_logprobs(lambda h: h @ head / 0.7, hidden, tokens, chunk)
    want_logp, want_entropy = _reference(hidden, head, tokens)
    np.testing.assert_allclose(logp, want_logp, atol=1e-5)
    np.testing.assert_allclose(entropy, want_entropy, atol=1e-5)
    assert np.all(logp[:, 0] == 0) and np.all(entropy[:, 0] == 0)

    def reference_objective(hidden, head, tokens, weights):
        logp, entropy = _reference(hidden, head, tokens)
        return jnp.sum(weights * logp) + 0.3 * jnp.sum(weights * entropy)

    grads = jax.grad(_objective(chunk), argnums=(0, 1))(hidden, head, tokens, weights)
    want = jax.grad(reference_objective, argnums=(0, 1))(hidden, head, tokens, weights)
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_the_gradient_holds_one_chunk_of_logits_at_qwen_sizes():
    """One 8192-token row over Qwen2.5's 152,064-token vocabulary (float32 logits: 5 GB): the
    compiled gradient's temporaries, whole against 1024 positions at a time."""
    t, d, v = 8192, 64, 152_064
    args = (jax.ShapeDtypeStruct((1, t, d), jnp.float32), jax.ShapeDtypeStruct((d, v), jnp.float32),
            jax.ShapeDtypeStruct((1, t), jnp.int32), jax.ShapeDtypeStruct((1, t), jnp.float32))

    def temp_bytes(chunk):
        compiled = jax.jit(jax.grad(_objective(chunk), argnums=(0, 1))).lower(*args).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    logits_bytes = t * v * 4
    whole, chunked, smaller = temp_bytes(None), temp_bytes(1024), temp_bytes(256)
    assert whole >= 3 * logits_bytes  # the logits, their softmax and their gradient
    assert chunked <= whole / 7 and smaller <= chunked / 3  # a few copies of one chunk


@pytest.mark.parametrize("chunk", [None, 3])
def test_a_response_window_gives_the_whole_logits_values_there_and_0_elsewhere(chunk):
    rng = np.random.default_rng(1)
    hidden = jnp.asarray(rng.normal(size=(3, 20, 8)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(8, 37)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, 37, (3, 20)), jnp.int32)
    starts = jnp.asarray([5, 1, 17])  # the last row's window runs past the end: dropped
    window = starts[:, None] + jnp.arange(6)[None, :]
    logp, entropy = token_logprobs(lambda h: h @ head / 0.7, hidden, tokens, chunk,
                                   positions=window)
    want_logp, want_entropy = _reference(hidden, head, tokens)
    positions = np.arange(20)[None, :]
    inside = (positions >= np.asarray(starts)[:, None]) & (
        positions < np.asarray(starts)[:, None] + 6)
    np.testing.assert_allclose(logp, np.where(inside, want_logp, 0), atol=1e-5)
    np.testing.assert_allclose(entropy, np.where(inside, want_entropy, 0), atol=1e-5)

    weights = jnp.asarray(rng.uniform(size=(3, 20)) * inside, jnp.float32)
    in_window = jax.grad(lambda h: jnp.sum(weights * token_logprobs(
        lambda x: x @ head / 0.7, h, tokens, chunk, False, window)[0]))(hidden)
    whole = jax.grad(lambda h: jnp.sum(weights * _reference(h, head, tokens)[0]))(hidden)
    np.testing.assert_allclose(in_window, whole, atol=1e-5)
