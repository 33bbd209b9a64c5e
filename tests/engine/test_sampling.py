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

from memagent_jax.engine.sampling import first_argmax, inverse_cdf, sample, truncation_threshold

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


# The pieces, at the Qwen2.5 vocabulary size, against numpy (ties, zeros and edges included).
VOCAB = 151936


def test_first_argmax_is_argmax_with_ties():
    logits = np.random.RandomState(1).normal(size=(5, VOCAB)).astype(np.float32)
    logits[:, [7, 90000, 151935]] = 9.0  # three-way tie: the first index wins
    logits[4, 151935] = 10.0
    np.testing.assert_array_equal(np.asarray(first_argmax(jnp.asarray(logits))),
                                  np.argmax(logits, axis=-1))


def test_inverse_cdf_matches_searchsorted_and_skips_zero_weights():
    rng = np.random.RandomState(2)
    weights = rng.exponential(size=(6, VOCAB)).astype(np.float32)
    weights[:, ::3] = 0.0  # every third entry impossible
    weights[5, :] = 0.0
    weights[5, 1000] = 1.0  # a single possible entry
    fraction = np.array([1e-9, 0.25, 0.5, 0.999, 1.0, 0.3], np.float32)
    picked = np.asarray(jax.jit(inverse_cdf)(jnp.asarray(weights), jnp.asarray(fraction)))
    cumulative = np.cumsum(weights.astype(np.float64), axis=-1)
    expected = [np.searchsorted(c, f * c[-1]) for c, f in zip(cumulative, fraction)]
    assert np.all(weights[np.arange(6), picked] > 0)
    assert picked[5] == 1000
    # float32 sums in two levels against float64: the same index or a neighbouring possible one
    assert np.all(np.abs(picked - np.array(expected)) <= 3), (picked, expected)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 0.95), (1.0, 50, 1.0),
                                                     (1.3, 400, 0.5), (0.5, 0, 0.2)])
def test_truncation_threshold_matches_sorting(temperature, top_k, top_p):
    """The bisection's cut-off equals the sorted-cumulative-mass definition (the test's
    `exact_distribution`) on a 152K vocabulary."""
    logits = np.random.RandomState(3).normal(0, 3, (2, VOCAB)).astype(np.float32)
    threshold = np.asarray(jax.jit(truncation_threshold)(
        jnp.asarray(logits), jnp.full((2, 1), temperature), jnp.full(2, top_p),
        jnp.full(2, top_k, jnp.int32)))
    for row in range(2):
        kept = exact_distribution(logits[row].astype(np.float64), temperature, top_k, top_p) > 0
        assert threshold[row] == logits[row][kept].min()

