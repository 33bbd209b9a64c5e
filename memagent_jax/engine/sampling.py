"""Token sampling for all decode slots at once: greedy, temperature, top-k, top-p.

Each slot carries its request's own key; the token at generation step t is drawn with
fold_in(key, t), so a seed gives the same tokens whichever slot a request lands in and whatever
else runs beside it. Truncation order is top-k, then top-p over the renormalised survivors (as
transformers' and vLLM's samplers); ties at a cut-off are all kept. The returned
log-probability is the token's under the model at the request's temperature, before any
truncation: what a policy-gradient learner needs.

Every step handles [slots, vocabulary] arrays (152K entries a row for Qwen2.5), so nothing here
sorts the vocabulary, draws a random number per entry or stores a scaled copy: argmax, the draw
and the top-k / top-p cut-offs are a few fused reductions each (see the functions' notes).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """temperature 0 is greedy; top_k 0 and top_p 1 switch those filters off; seed None draws
    a fresh one. top_logprobs: the caller reads each token's most likely alternatives (from an
    engine with `EngineConfig.top_logprobs`; its steps skip them while no slot asks)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    top_logprobs: bool = False


def request_key(seed: int, sample_index: int) -> jnp.ndarray:
    """The raw key [2] uint32 of sample `sample_index` of a request seeded with `seed`."""
    return jax.random.fold_in(jax.random.PRNGKey(seed), sample_index)


def sample(logits: jnp.ndarray, temperature: jnp.ndarray, top_p: jnp.ndarray,
           top_k: jnp.ndarray, keys: jnp.ndarray, steps: jnp.ndarray):
    """logits [S, V] float32; temperature, top_p [S] float32; top_k, steps [S] int32;
    keys [S, 2] uint32. Returns (tokens [S] int32, logprobs [S] float32)."""
    greedy = temperature <= 0
    divisor = jnp.where(greedy, 1.0, temperature)[:, None]
    best = first_argmax(logits)
    top = jnp.max(logits, axis=-1, keepdims=True)

    def draw():
        # Truncation, when a row asks for it, comes back as a per-row threshold on the logits,
        # found without sorting the vocabulary, and the weights exp((logit - max) / T) are one
        # fused pass over the logits. (Passed into the cond, any [S, V] value was written out
        # whole every step; a select or product of two [S, V] values costs more on XLA:CPU
        # than this exp(where(...)).)
        needs_truncation = jnp.any(~greedy & ((top_k > 0) | (top_p < 1)))
        threshold = jax.lax.cond(
            needs_truncation, lambda: truncation_threshold(logits, divisor, top_p, top_k),
            lambda: jnp.full(logits.shape[:1], -jnp.inf))
        weights = jnp.exp(jnp.where(logits >= threshold[:, None], (logits - top) / divisor,
                                    -jnp.inf))
        # Inverse transform sampling: one uniform number per row, not a Gumbel sample per
        # vocabulary entry (jax.random.categorical runs threefry over every entry).
        step_keys = jax.vmap(jax.random.fold_in)(keys, steps)
        uniform = jax.vmap(jax.random.uniform)(step_keys)
        return jnp.where(greedy, best, inverse_cdf(weights, 1.0 - uniform))

    # An all-greedy batch (free slots are greedy too) skips the draw over [S, V].
    tokens = jax.lax.cond(jnp.all(greedy), lambda: best, draw)
    picked = jnp.take_along_axis(logits, tokens[:, None], axis=-1)
    return tokens, ((picked - top) / divisor)[:, 0] - _log_normaliser(logits, top, divisor)


def top_logprobs(logits: jnp.ndarray, temperature: jnp.ndarray, k: int):
    """logits [S, V] float32, temperature [S] float32 -> (ids [S, k] int32, logprobs [S, k]
    float32): each row's k most likely tokens, most likely first, with the log-probabilities
    `sample` gives a token it draws (at the row's temperature; greedy rows at 1). Softmax
    keeps the order of the logits, so only the k picked logits are scaled."""
    divisor = jnp.where(temperature <= 0, 1.0, temperature)[:, None]
    top = jnp.max(logits, axis=-1, keepdims=True)
    values, ids = jax.lax.top_k(logits, k)
    normaliser = _log_normaliser(logits, top, divisor)[:, None]
    return ids.astype(jnp.int32), (values - top) / divisor - normaliser


def _log_normaliser(logits: jnp.ndarray, top: jnp.ndarray, divisor: jnp.ndarray) -> jnp.ndarray:
    """[S]: log sum exp((logits - top) / divisor) over the vocabulary, written so that no
    scaled [S, V] array is stored: with two reductions over it (max, then sum of exp), XLA
    writes it out whole (19 MB at 32 rows)."""
    return jnp.log(jnp.sum(jnp.exp((logits - top) / divisor), axis=-1))


def first_argmax(x: jnp.ndarray) -> jnp.ndarray:
    """jnp.argmax over the last axis of x [S, V] (the first index of the maximum), in two
    levels: the maxima of chunks of the row (a plain, vectorised reduction), then argmax over
    those and within the winning chunk only: XLA:CPU runs argmax's (value, index) reduction
    unvectorised over a whole row (BENCHMARKS.md, "Kernel choices on XLA:CPU")."""
    rows, size = x.shape
    chunk = _divisor_near_sqrt(size)
    chunks = x.reshape(rows, size // chunk, chunk)
    best_chunk = jnp.argmax(chunks.max(axis=-1), axis=-1)
    within = jnp.take_along_axis(chunks, best_chunk[:, None, None], axis=1)[:, 0]
    return (best_chunk * chunk + jnp.argmax(within, axis=-1)).astype(jnp.int32)


def inverse_cdf(weights: jnp.ndarray, fraction: jnp.ndarray) -> jnp.ndarray:
    """weights [S, V] >= 0 (unnormalised probabilities), fraction [S] in (0, 1]: per row the
    first index whose cumulative weight reaches fraction x the row's total, which is never an
    index of weight 0. In two levels, as `first_argmax`: the cumulative sums of chunk totals
    pick the chunk, then the cumulative sum within that chunk the index, rather than one
    cumsum over all V entries."""
    rows, size = weights.shape
    chunk = _divisor_near_sqrt(size)
    chunks = weights.reshape(rows, size // chunk, chunk)
    totals = jnp.cumsum(chunks.sum(axis=-1), axis=-1)  # [S, V / chunk]
    target = fraction * totals[:, -1]
    picked = jnp.sum(totals < target[:, None], axis=-1)  # < V / chunk: target <= the total
    before = jnp.where(picked > 0, jnp.take_along_axis(
        totals, jnp.maximum(picked - 1, 0)[:, None], axis=-1)[:, 0], 0.0)
    within = jnp.take_along_axis(chunks, picked[:, None, None], axis=1)[:, 0]  # [S, chunk]
    index = jnp.sum(jnp.cumsum(within, axis=-1) + before[:, None] < target[:, None], axis=-1)
    # Rounding between the two sums could step past the chunk's last positive weight.
    last_positive = jnp.max(jnp.where(within > 0, jnp.arange(chunk), 0), axis=-1)
    return (picked * chunk + jnp.minimum(index, last_positive)).astype(jnp.int32)


@functools.lru_cache(maxsize=16)
def _divisor_near_sqrt(n: int) -> int:
    return max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)


def truncation_threshold(logits: jnp.ndarray, divisor: jnp.ndarray, top_p: jnp.ndarray,
                          top_k: jnp.ndarray) -> jnp.ndarray:
    """[S]: the smallest logit each row keeps after its top-k (every tie of the k-th largest
    kept), then the top-p nucleus of those at its temperature (logits / divisor [S, 1]),
    renormalised: the fewest largest entries whose probability reaches top_p x theirs.

    Both cut-offs are found by bisection over the bit patterns of the weights
    exp((logit - max) / T) in [0, 1] (non-negative floats order as their int32 bits): 31
    masked sums each, exact to the bit, where sorting the vocabulary of every row every step
    would cost more than the step (BENCHMARKS.md, "Kernel choices on XLA:CPU")."""
    vocab = logits.shape[-1]
    weights = jnp.exp((logits - jnp.max(logits, axis=-1, keepdims=True)) / divisor)
    bits = jax.lax.bitcast_convert_type(weights, jnp.int32)
    # Every weight is >= 0.0 (bits 0); none reaches one step above 1.0.
    lowest = jnp.zeros(logits.shape[:1], jnp.int32)
    above_all = jnp.full(logits.shape[:1],
                         jax.lax.bitcast_convert_type(jnp.float32(1), jnp.int32) + 1)

    def largest(condition):
        """Per row the largest bits b with condition(b) [S] true (condition falls with b)."""
        def halve(_, bounds):
            low, high = bounds  # condition(low) holds, condition(high) does not
            middle = low + (high - low) // 2
            holds = condition(middle)
            return jnp.where(holds, middle, low), jnp.where(holds, high, middle)
        return jax.lax.fori_loop(0, 31, halve, (lowest, above_all))[0]

    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    kth = jax.lax.cond(jnp.any(top_k > 0),
                       lambda: largest(lambda b: jnp.sum(bits >= b[:, None], axis=-1) >= k),
                       lambda: lowest)

    def mass(b):  # the weight of the entries at or above both b and the top-k cut-off
        return jnp.sum(jnp.where(bits >= jnp.maximum(b, kth)[:, None], weights, 0.0), axis=-1)

    needed = top_p * mass(kth)
    cut = jax.lax.cond(jnp.any(top_p < 1), lambda: largest(lambda b: mass(b) >= needed),
                       lambda: kth)
    return jnp.min(jnp.where(bits >= cut[:, None], logits, jnp.inf), axis=-1)
