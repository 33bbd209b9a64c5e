"""Sharded loading and forward on 8 simulated CPU devices equal the unsharded model.

The tolerance is the float32 one of the transformers parity tests (1e-4 on O(1) logits):
sharded matmuls sum in a different order, which moves logits by ~2e-5.
"""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from memagent_jax.cli import main
from memagent_jax.errors import UserError
from memagent_jax.models.loading import load_model
from memagent_jax.models.sharding import batch_sharding, make_mesh
from tests.hf_reference import hf_logits, hf_model, write_hf_model

pytestmark = pytest.mark.slow  # models compiled on meshes of 8 devices

SHAPE = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_attention_heads=8,
             num_key_value_heads=4)
MESHES = [{"tensor": 2, "fsdp": 4}, {"data": 2, "tensor": 4}, {"fsdp": 8},
          {"data": 2, "fsdp": 2, "tensor": 2}]


def _forward(model, ids, sharding=None):
    graphdef, state = nnx.split(model)
    ids = jax.device_put(ids, sharding) if sharding is not None else ids
    return np.asarray(jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))(state, ids))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return write_hf_model(tmp_path_factory.mktemp("hf") / "m", seed=8, **SHAPE)


@pytest.fixture(scope="module")
def ids():
    return np.random.RandomState(6).randint(0, 128, (8, 24)).astype(np.int32)


@pytest.fixture(scope="module")
def unsharded_logits(hf_dir, ids):
    model, _ = load_model(hf_dir)
    return _forward(model, ids)


@pytest.mark.parametrize("axes", MESHES, ids=lambda a: "x".join(f"{k}{v}" for k, v in a.items()))
def test_sharded_logits_equal_unsharded(hf_dir, ids, unsharded_logits, axes):
    mesh = make_mesh(axes)
    model, _ = load_model(hf_dir, mesh=mesh)
    q_kernel = model.layers[1].attn.q_kernel[...]
    tensor, fsdp = mesh.shape["tensor"], mesh.shape["fsdp"]
    assert q_kernel.sharding.spec == P("fsdp" if fsdp > 1 else None,
                                       "tensor" if tensor > 1 else None, None)
    shard_shape = q_kernel.addressable_shards[0].data.shape
    assert shard_shape == (64 // fsdp, 8 // tensor, 8)  # each device holds only its part
    logits = _forward(model, ids, batch_sharding(mesh))
    np.testing.assert_allclose(logits, unsharded_logits, atol=1e-4, rtol=0)


def test_checkpoint_restores_onto_a_mesh(hf_dir, ids, unsharded_logits, tmp_path):
    assert main(["convert", "--model", hf_dir, "--out", str(tmp_path / "ckpt")]) == 0
    mesh = make_mesh({"fsdp": 4, "tensor": 2})
    model, _ = load_model(str(tmp_path / "ckpt"), mesh=mesh)
    assert model.layers[0].mlp.gate_kernel[...].sharding.spec == P("fsdp", "tensor")
    np.testing.assert_allclose(_forward(model, ids, batch_sharding(mesh)), unsharded_logits,
                               atol=1e-4, rtol=0)


def test_a_sharded_qwen3_model_equals_transformers(tmp_path, ids):
    """Qwen3 over data 2 x fsdp 2 x tensor 2: its head norms ([head_dim], shared by the heads)
    replicated, its projections split as Qwen2's; logits as transformers' Qwen3ForCausalLM."""
    path = write_hf_model(tmp_path / "qwen3", seed=10, arch="qwen3", **SHAPE)
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    model, _ = load_model(path, mesh=mesh)
    attn = model.layers[0].attn
    assert attn.q_norm[...].sharding.spec == attn.k_norm[...].sharding.spec == P(None)
    assert attn.q_kernel[...].sharding.spec == P("fsdp", "tensor", None)
    np.testing.assert_allclose(_forward(model, ids, batch_sharding(mesh)),
                               hf_logits(hf_model(seed=10, arch="qwen3", **SHAPE), ids),
                               atol=1e-4, rtol=0)


def test_dims_the_mesh_does_not_divide_are_replicated(tmp_path):
    """vocab 101 and 2 KV heads over tensor=4: those dims stay whole, the rest is sharded."""
    path = write_hf_model(tmp_path / "odd", seed=9)
    model, _ = load_model(path, mesh=make_mesh({"tensor": 4, "fsdp": 2}))
    assert model.embed[...].sharding.spec == P(None, "fsdp")
    assert model.layers[0].attn.k_kernel[...].sharding.spec == P("fsdp", None, None)
    assert model.layers[0].attn.q_kernel[...].sharding.spec == P("fsdp", "tensor", None)


@pytest.mark.parametrize("axes,message", [
    ({"tensor": 3}, "need 3 devices"),
    ({"model": 2, "fsdp": -1}, "unknown mesh axis 'model'"),
    ({"data": -1, "fsdp": -1}, "only one axis may be -1"),
    ({"tensor": 0}, "mesh.tensor"),
])
def test_bad_mesh_is_a_clear_error(axes, message):
    with pytest.raises(UserError, match=message):
        make_mesh(axes)
