"""The Pallas ragged cache reads (models/cache_kernels.py) in Pallas's interpret mode against
the length-masked dense read (`attend_cache`); the TPU kernel compiled by libtpu for v5p, and
the GPU kernel lowered to Triton for CUDA, at Qwen2.5-7B's decode shapes (the engine's steps
with each kernel: tests/engine/test_rollout_layout.py)."""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memagent_jax.models.attention import attend_cache
from memagent_jax.models.cache_kernels import attend_cache_ragged_gpu, attend_cache_ragged_tpu
from tests.builders import decode_cache, length_mask

pytestmark = pytest.mark.slow  # Pallas kernels in interpret mode

KERNELS = {"tpu": attend_cache_ragged_tpu, "gpu": attend_cache_ragged_gpu}


def _interpreted(name, block):
    return jax.jit(functools.partial(KERNELS[name], block=block, interpret=True))


def _dense(q, k, v, lengths):
    return attend_cache(q, k, v, length_mask(lengths, q.shape[1], k.shape[3]))


# Lengths 1, one block, block + 1, two blocks, S; S not a multiple of the block (a last,
# partial block); a group of 7 query heads (padded rows); T > 1; a block longer than S; head
# dims 16 and 8 (below Triton's least tile side: padded by masked loads).
@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("lengths, s, block, t, heads, d", [
    ([1, 16, 17, 32, 50, 60], 60, 16, 1, (2, 2), 16),
    ([1, 16, 17, 32, 50, 60], 60, 16, 1, (14, 2), 16),
    ([64, 17, 1], 64, 16, 3, (8, 2), 16),
    ([5, 1, 3], 5, 16, 2, (2, 2), 8),
])
def test_kernel_equals_the_length_masked_dense_read(kernel, lengths, s, block, t, heads, d):
    q, k, v, lengths = decode_cache(lengths, s, t, *heads, seed=s + t + heads[0], d=d)
    expected = _dense(q, k, v, lengths)
    got = _interpreted(kernel, block)(q, k, v, lengths)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_kernel_reads_nothing_past_a_row_length(kernel):
    """NaN in every key and value at or past a row's length: the output is finite and equals
    the clean cache's (the dense read's masked probability 0 times a NaN value is NaN)."""
    s = 60
    q, k, v, lengths = decode_cache([1, 16, 17, 32, 50, 60], s, 1, 8, 2, seed=5, d=16)
    past = jnp.arange(s)[None, None] >= lengths[:, None, None]  # [B, 1, S]
    k_nan = jnp.where(past[:, :, None, :], jnp.nan, k)
    v_nan = jnp.where(past[..., None], jnp.nan, v)
    read = _interpreted(kernel, 16)
    got = read(q, k_nan, v_nan, lengths)
    assert bool(jnp.isfinite(got).all())
    np.testing.assert_array_equal(np.asarray(got), np.asarray(read(q, k, v, lengths)))


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_kernel_in_bfloat16_tracks_float32(kernel):
    q, k, v, lengths = decode_cache([1, 16, 17, 32, 50, 60], 60, 1, 8, 2, seed=3, d=16)
    expected = _dense(q, k, v, lengths)
    got = _interpreted(kernel, 16)(*(x.astype(jnp.bfloat16) for x in (q, k, v)), lengths)
    assert got.dtype == jnp.bfloat16
    scale = float(jnp.abs(expected).max())
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(expected),
                               atol=0.03 * scale, rtol=0)


# Qwen2.5-7B's decode on one chip of a tensor-4 mesh: 8 slots, 7 query heads over 1 KV head of
# 128, the 7B configs' longest cache (8448: not a multiple of the TPU kernel's block).
_7B = ((8, 1, 7, 128), (8, 1, 128, 8448), (8, 1, 8448, 128), (8,))


def _abstract(sharding=None):
    return tuple(jax.ShapeDtypeStruct(shape, jnp.int32 if len(shape) == 1 else jnp.bfloat16,
                                      sharding=sharding) for shape in _7B)


def test_the_tpu_kernel_compiles_for_v5p():
    pytest.importorskip("libtpu", reason="libtpu is installed by the test extra (jax[tpu])")
    from jax.experimental import topologies

    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # see test_tpu_compile.py
    device = topologies.get_topology_desc(platform="tpu", topology_name="v5p:2x2x1").devices[0]
    compiled = jax.jit(attend_cache_ragged_tpu).lower(
        *_abstract(jax.sharding.SingleDeviceSharding(device))).compile()
    assert "tpu_custom_call" in compiled.as_text()
    memory = compiled.memory_analysis()
    assert memory.output_size_in_bytes == 8 * 7 * 128 * 2


def test_the_gpu_kernel_lowers_to_triton_for_cuda():
    """Lowered only (compiling Triton needs a GPU: tests/models/test_gpu.py runs it there)."""
    exported = jax.export.export(
        jax.jit(attend_cache_ragged_gpu), platforms=("cuda",),
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(*_abstract())
    assert "__gpu$xla.gpu.triton" in exported.mlir_module()
    assert exported.out_avals[0].shape == (8, 1, 7, 128)
