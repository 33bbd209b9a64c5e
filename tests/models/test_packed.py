"""Packed rows (segment ids) through the model's training forward: on the attention paths
that run on CPU, each row's logits and the gradient of a loss over them equal those of the
rows run alone ("xla", the blocked kernel, through the learner: tests/rl/test_batching.py);
and the blocked kernel with segments against the masked reference, forward and gradient,
including tiles where a query has seen no key yet."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memagent_jax.models import qwen
from memagent_jax.models.attention import attend, attend_causal, segment_starts
from memagent_jax.models.loading import random_model
from memagent_jax.models.qwen import segment_positions
from tests.builders import LEARNER_MODEL

pytestmark = [pytest.mark.filterwarnings("ignore:attention 'splash' off TPU"),
              pytest.mark.filterwarnings("ignore:packed rows under attention 'cudnn' off GPU"),
              pytest.mark.slow]  # packed rows compiled under three attentions

# Two sequences of 24 tokens: rows of 11, 7 and 4 tokens then 2 of padding; rows of 5 and 16
# then 3 of padding. Segment ids 1, 2, ... per row, 0 for padding.
LAYOUT = [[11, 7, 4], [5, 16]]
LENGTH = 24


def _packed(rows):
    tokens = np.zeros((len(LAYOUT), LENGTH), np.int32)
    segments = np.zeros((len(LAYOUT), LENGTH), np.int32)
    places = []  # (sequence, offset) of each row, in rows' order
    k = 0
    for s, lengths in enumerate(LAYOUT):
        at = 0
        for i, n in enumerate(lengths):
            tokens[s, at:at + n] = rows[k]
            segments[s, at:at + n] = i + 1
            places.append((s, at))
            at, k = at + n, k + 1
    return jnp.asarray(tokens), jnp.asarray(segments), places


def _rows(seed=0):
    r = np.random.default_rng(seed)
    return [r.integers(0, LEARNER_MODEL.vocab_size, n) for lengths in LAYOUT for n in lengths]


def _model(attention):
    return random_model(LEARNER_MODEL, seed=2,
                        attention="xla" if attention == "reference" else attention)


def _weights(rows):
    return [jnp.asarray(np.random.default_rng(i).normal(size=(len(r), LEARNER_MODEL.vocab_size)),
                        jnp.float32) for i, r in enumerate(rows)]


@pytest.fixture(scope="module")
def alone():
    """The rows one to a batch row, right-padded (padding after a row never reaches it), on
    the blocked kernel: (each row's logits, the gradient of sum(logits * weights))."""
    rows = _rows()
    graphdef, state = nnx.split(_model("xla"))
    tokens = np.zeros((len(rows), max(map(len, rows))), np.int32)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
    weights = _weights(rows)

    def loss(state):
        logits = nnx.merge(graphdef, state)(jnp.asarray(tokens))
        per_row = [logits[i, :len(r)] for i, r in enumerate(rows)]
        return sum(jnp.sum(x * w) for x, w in zip(per_row, weights)), per_row

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(state)
    return logits, grads


@pytest.mark.parametrize("attention", ["dot_product", "reference", "splash", "cudnn"])
def test_packed_rows_give_each_rows_logits_and_gradient(attention, alone):
    rows = _rows()
    graphdef, state = nnx.split(_model(attention))
    tokens, segments, places = _packed(rows)
    weights = _weights(rows)

    def loss(state):
        m = nnx.merge(graphdef, state)
        if attention == "reference":  # the masked path: attend() with the segments' mask
            logits = m(tokens, segment_ids=segments)
        else:
            logits = m.logits(m.hidden(tokens, segment_ids=segments))
        per_row = [logits[s, at:at + len(r)] for (s, at), r in zip(places, rows)]
        return sum(jnp.sum(x * w) for x, w in zip(per_row, weights)), per_row

    (_, got), got_grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(state)
    want, want_grads = alone
    for g, w in zip(got, want):
        assert float(jnp.abs(g - w).max()) <= 1e-5
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got_grads),
                            jax.tree.leaves(want_grads)):
        scale = float(jnp.abs(w).max())
        assert float(jnp.abs(g - w).max()) <= 1e-5 * max(scale, 1.0), path


def test_cudnn_packed_rows_lower_to_the_triton_kernels_for_cuda():
    """Packed rows under attention 'cudnn' (whose jax.nn path takes no segment ids) at a 7B
    layer's heads (7 query heads over 1 KV head of 128, bf16), 1000 tokens: the forward and
    the gradient lower to jax's Triton flash kernels for CUDA (forward; the backward's
    preprocessing and its kernel). Compiling them needs a GPU (tests/models/test_gpu.py)."""
    from memagent_jax.models.flash_gpu import flash_gpu_causal

    t = 1000
    segments = jnp.asarray(np.repeat([1, 2, 3], [400, 350, 250])[None], jnp.int32)

    def loss(q, k, v):
        out = flash_gpu_causal(q, k, v, segments, interpret=False)
        return out.astype(jnp.float32).sum()

    shapes = [jax.ShapeDtypeStruct((1, t, h, 128), jnp.bfloat16) for h in (7, 1, 1)]
    exported = jax.export.export(
        jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))), platforms=("cuda",),
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(*shapes)
    assert exported.mlir_module().count("custom_call @__gpu$xla.gpu.triton") == 3


def _segments(layouts, length):
    """[B, length] int32: segment ids 1, 2, ... for the given run lengths, 0 after them."""
    out = np.zeros((len(layouts), length), np.int32)
    for b, runs in enumerate(layouts):
        at = 0
        for i, n in enumerate(runs):
            out[b, at:at + n] = i + 1
            at += n
    return jnp.asarray(out)


@pytest.mark.parametrize("layouts, block", [
    # The first row starts a segment at 9: its queries in block 2 (8..11) see no key of key
    # blocks 0 and 1, which the second row (one segment) keeps in the loop.
    ([[9, 21], [30]], 4),
    ([[3, 3, 3, 20], [17, 1, 1, 8]], 8),   # length 30 padded to 32 by the kernel
])
def test_blocked_kernel_with_segments_equals_the_masked_reference(layouts, block):
    t = 30
    r = np.random.default_rng(block)
    q, k, v = (jnp.asarray(r.standard_normal((2, t, h, 8)) * 2, jnp.float32) for h in (6, 2, 2))
    weights = jnp.asarray(r.standard_normal((2, t, 6, 8)), jnp.float32)
    segments = _segments(layouts, t)
    visible = (jnp.tril(jnp.ones((t, t), bool))[None]
               & (segments[:, :, None] == segments[:, None, :]))

    def value_and_grads(attention):
        def loss(q, k, v):
            out = attention(q, k, v)
            return jnp.sum(out * weights), out
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)

    (_, want), want_grads = value_and_grads(lambda q, k, v: attend(q, k, v, visible))
    (_, got), got_grads = value_and_grads(
        lambda q, k, v: attend_causal(q, k, v, block, segment_ids=segments))
    assert not any(bool(jnp.isnan(x).any()) for x in (got, *got_grads))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
    scale = max(float(jnp.abs(g).max()) for g in want_grads)
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6 * scale)


def test_positions_restart_at_each_segment():
    """Rope is relative, so a row's values cannot show where its positions start: checked
    here directly (the engine, whose log-probs the learner's are compared with, starts each
    turn at 0)."""
    ids = jnp.asarray([[1, 1, 2, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 2]])
    np.testing.assert_array_equal(segment_starts(ids), [[0, 0, 2, 2, 2, 5, 6, 6],
                                                        [0] * 7 + [7]])
    np.testing.assert_array_equal(segment_positions(ids), [[0, 1, 0, 1, 2, 0, 0, 1],
                                                            list(range(7)) + [0]])


@pytest.mark.parametrize("path", ["hidden", "masked"])
def test_positions_reaching_rope_restart_at_each_segment(path, monkeypatch):
    """The positions the model's layers rotate q and k by (every apply_rope call) restart at
    0 at each segment's first token, on `hidden` and on the masked `__call__` with segment_ids."""
    seen = []
    real = qwen.apply_rope

    def spy(x, positions, inv_freq, factor):
        jax.debug.callback(lambda p: seen.append(np.asarray(p)), positions)
        return real(x, positions, inv_freq, factor)

    monkeypatch.setattr(qwen, "apply_rope", spy)
    model = random_model(LEARNER_MODEL, seed=0, attention="xla")
    segments = _segments([[3, 5, 2], [4, 6]], 12)  # row 0 ends in 2 tokens of padding
    tokens = jnp.ones((2, 12), jnp.int32)
    if path == "hidden":
        jax.block_until_ready(model.hidden(tokens, segment_ids=segments))
    else:
        jax.block_until_ready(model(tokens, segment_ids=segments))
    assert len(seen) == 2 * LEARNER_MODEL.num_layers  # q and k in each layer
    want = [[0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 0, 1], [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 1]]
    for p in seen:
        np.testing.assert_array_equal(p, want)
