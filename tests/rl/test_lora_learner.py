"""The learner under `learner.lora`: only the adapters train, the base stays as loaded, the
optimiser holds adapter-shaped state only, the adapters shard along their base weights."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from memagent_jax.models import lora
from memagent_jax.models.loading import random_model
from memagent_jax.models.lora_config import LoraConfig
from memagent_jax.models.qwen import split_params
from memagent_jax.models.sharding import make_mesh, param_shardings
from memagent_jax.rl.config import LearnerConfig
from memagent_jax.rl.learner import Learner
from tests.builders import LEARNER_MODEL, random_rows


def _host(tree):
    return jax.tree.map(np.asarray, tree)


@pytest.mark.slow
def test_a_lora_run_trains_only_the_adapters_on_the_mesh():
    mesh = make_mesh({"fsdp": 4, "tensor": 2})
    model = random_model(LEARNER_MODEL, seed=2, mesh=mesh)
    base = _host(split_params(model)[1])
    adapter_config = LoraConfig(rank=2, alpha=4.0)
    learner = Learner(model, LearnerConfig(lr=1e-2, warmup_steps=0, micro_batch_tokens=256,
                                           bucket_lengths=(32,), kl_coef=0.0,
                                           lora=adapter_config),
                      mesh=mesh, seed=1)
    adapters = learner.state()["params"]
    # Each adapter matrix lies along its kernel: A over the kernel's input axes, B its outputs.
    q = adapters["layers"][0]["attn"]["q_kernel"]
    kernel = param_shardings(LEARNER_MODEL, mesh)["layers"][0]["attn"]["q_kernel"].spec
    assert q["a"].sharding.spec == PartitionSpec(kernel[0], None) and kernel[0] == "fsdp"
    assert q["b"].sharding.spec == PartitionSpec(None, *kernel[1:]) and kernel[1] == "tensor"
    start = _host(adapters)

    for seed in range(3):
        metrics = learner.update(random_rows(seed=seed, trajectories=6))
        assert np.isfinite(metrics["loss"]) and metrics["updates"] == 1

    for a, b in zip(jax.tree.leaves(_host(learner.base)), jax.tree.leaves(base)):
        np.testing.assert_array_equal(a, b)  # the base: bit-identical
    trained = _host(learner.state()["params"])
    assert max(np.abs(a - b).max() for a, b in zip(jax.tree.leaves(trained),
                                                   jax.tree.leaves(start))) > 1e-3
    # Adam's two moments of each adapter matrix, its step counts: nothing of the base's size.
    shapes = sorted(x.shape for x in jax.tree.leaves(start))
    moments = sorted(x.shape for x in jax.tree.leaves(learner.state()["opt_state"]) if x.ndim)
    assert moments == sorted(shapes * 2)
    # The engine's weights: base + alpha/r AB, in the base's layout.
    merged = learner.params
    expected = lora.merge(base, trained, adapter_config.scale)
    for a, b in zip(jax.tree.leaves(_host(merged)), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert (merged["layers"][0]["attn"]["q_kernel"].sharding.spec ==
            base_spec(learner, "q_kernel"))
    assert not np.array_equal(np.asarray(merged["layers"][0]["mlp"]["down_kernel"]),
                              base["layers"][0]["mlp"]["down_kernel"])


def base_spec(learner, name):
    return learner.base["layers"][0]["attn"][name].sharding.spec
