"""Sampled token frequencies against the exact distribution each setting defines.

20,000 draws per setting; a token's frequency must lie within 5 standard errors
(5 * sqrt(p (1 - p) / N)) of its exact probability, plus 1e-3 for float rounding. Over 16
tokens and 5 settings the chance that a correct sampler fails is below 1e-4; a sampler that
skips a filter, applies temperature twice or truncates in the wrong order fails by many errors.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memagent_jax.rollout.sampling import sample

DRAWS = 20_000
LOGITS = np.random.RandomState(0).normal(0, 1.5, 16).astype(np.float32)


def exact_distribution(logits, temperature, top_k, top_p):
    """top-k, then top-p over the renormalised survivors; computed independently in numpy."""
    p = np.exp((logits - logits.max()) / temperature)
    p /= p.sum()
    order = np.argsort(-p)
    keep = np.zeros_like(p, bool)
    keep[order[: top_k or len(p)]] = True
    q = np.where(keep, p, 0)
    q /= q.sum()
    mass_before = 0.0
    nucleus = np.zeros_like(keep)
    for token in order:
        if keep[token] and mass_before < top_p:
            nucleus[token] = True
            mass_before += q[token]
    r = np.where(nucleus, q, 0)
    return r / r.sum()


def draw(temperature, top_k, top_p, seed=0):
    n = DRAWS
    tokens, logprobs = jax.jit(sample)(
        jnp.broadcast_to(jnp.asarray(LOGITS), (n, len(LOGITS))),
        jnp.full(n, temperature, jnp.float32), jnp.full(n, top_p, jnp.float32),
        jnp.full(n, top_k, jnp.int32),
        jnp.broadcast_to(jax.random.PRNGKey(seed), (n, 2)), jnp.arange(n, dtype=jnp.int32))
    return np.asarray(tokens), np.asarray(logprobs)


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, 0, 1.0), (0.5, 0, 1.0), (1.7, 0, 1.0), (1.0, 5, 1.0), (1.0, 0, 0.7),
    (0.8, 6, 0.6),
])
def test_frequencies_match_exact_distribution(temperature, top_k, top_p):
    tokens, logprobs = draw(temperature, top_k, top_p)
    expected = exact_distribution(LOGITS, temperature, top_k, top_p)
    observed = np.bincount(tokens, minlength=len(LOGITS)) / DRAWS
    bound = 5 * np.sqrt(expected * (1 - expected) / DRAWS) + 1e-3
    assert np.all(np.abs(observed - expected) <= bound), (observed, expected)
    assert np.all(observed[expected == 0] == 0)  # truncated tokens never drawn
    # logprobs: the model's at this temperature, before truncation.
    full = jax.nn.log_softmax(jnp.asarray(LOGITS) / temperature)
    np.testing.assert_allclose(logprobs, np.asarray(full)[tokens], atol=1e-5)


def test_greedy_is_argmax_with_untempered_logprob():
    tokens, logprobs = draw(0.0, 0, 1.0)
    assert np.all(tokens == np.argmax(LOGITS))
    np.testing.assert_allclose(logprobs, np.asarray(jax.nn.log_softmax(LOGITS))[tokens],
                               atol=1e-6)


def test_same_key_and_step_same_token_other_keys_differ():
    a, _ = draw(1.0, 0, 1.0, seed=3)
    b, _ = draw(1.0, 0, 1.0, seed=3)
    c, _ = draw(1.0, 0, 1.0, seed=4)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
