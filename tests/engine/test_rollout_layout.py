"""The engine's own layout (models/sharding.py ROLLOUT_RULES) on data 2 x fsdp 2 x tensor 2 of
8 simulated devices: no KV entry held twice, weights split over tensor only and placed from
the learner's layout; and the tokens `generate` and `run` decode on it, prompts prefilled
several a call, equal to one device's (a DAPO step's rollout: tests/rl/test_trainer.py; the
scheduler's whole prefill calls: tests/engine/test_engine.py)."""

import functools
import math

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from memagent_jax.agents.memagent.agent import MemAgent
from memagent_jax.agents.memagent.config import MemAgentConfig
from memagent_jax.engine import engine as engine_module
from memagent_jax.engine.engine import Engine
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Request, complete
from memagent_jax.models.cache_kernels import attend_cache_ragged_gpu, attend_cache_ragged_tpu
from memagent_jax.models.loading import load_model
from memagent_jax.models.qwen import split_params
from memagent_jax.models.sharding import make_mesh
from memagent_jax.rollout.runner import build_runner
from tests.hf_reference import write_hf_model

pytestmark = pytest.mark.slow  # engines compiled on a mesh of 8 devices

AXES = {"data": 2, "fsdp": 2, "tensor": 2}
KERNELS = {"tpu": attend_cache_ragged_tpu, "gpu": attend_cache_ragged_gpu}


@pytest.fixture(scope="module", params=[(4, False), (1, True)], ids=["kv4", "kv1-tied"])
def models(request, tmp_path_factory):
    """(the model on one device, the same on the mesh in the learner's layout, its KV heads):
    4 KV heads split over tensor 2, an LM head of its own; 1, which tensor cannot split
    (attention data-parallel), the embedding as the LM head."""
    kv_heads, tied = request.param
    path = write_hf_model(tmp_path_factory.mktemp("m"), seed=11, hidden_size=64,
                          num_attention_heads=8, num_key_value_heads=kv_heads,
                          intermediate_size=128, vocab_size=128, tie_word_embeddings=tied)
    return load_model(path)[0], load_model(path, mesh=make_mesh(AXES))[0], kv_heads


def test_each_kv_entry_is_held_once_and_weights_split_over_tensor_only(models):
    _, model, kv_heads = models
    mesh = make_mesh(AXES)
    engine = Engine(model, EngineConfig(slots=8, max_len=64), mesh=mesh)
    slots = ("data", "fsdp") if kv_heads == 4 else ("data", "fsdp", "tensor")
    for layer in engine.init_decode_state().cache.k + engine.init_decode_state().cache.v:
        assert layer.sharding.spec[0] == slots
        assert math.prod(layer.sharding.shard_shape(layer.shape)) * 8 == layer.size
    learners = split_params(model)[1]
    placed = engine.place(learners)
    assert learners["layers"][0]["mlp"]["gate_kernel"].sharding.spec == P("fsdp", "tensor")
    assert placed["layers"][0]["mlp"]["gate_kernel"].sharding.spec == P(None, "tensor")
    assert placed["layers"][0]["attn"]["q_kernel"].sharding.spec == P(None, "tensor", None)
    for leaf in jax.tree.leaves(placed):
        assert {"data", "fsdp"}.isdisjoint(jax.tree.leaves(tuple(leaf.sharding.spec)))
    for a, b in zip(jax.tree.leaves(learners), jax.tree.leaves(placed)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert engine.place(placed) is placed  # already in the layout: no copy


def _sharp(model):
    """The model's parameters x 5: a random model's N(0, 0.02) weights give nearly uniform
    attention and next-token distributions, which hide most errors in what a slot attends to
    from sampled tokens and log-probs; x 5 makes them depend on the context (and amplifies
    f32 rounding: log-probs within 1e-3)."""
    return jax.tree.map(lambda x: 5 * x, split_params(model)[1])


def _prompts(count, seed, low=2, high=40):
    rng = np.random.RandomState(seed)
    return [tuple(int(t) for t in rng.randint(3, 128, rng.randint(low, high + 1)))
            for _ in range(count)]


def test_generate_decodes_on_the_mesh_what_one_device_decodes(models):
    """Greedy and temperature-1 requests (one of n 3), prompts prefilled 4 a call on the mesh,
    one a call on one device: the same tokens, log-probs within 1e-3 (f32 sums in another
    order, amplified by _sharp)."""
    one, sharded, _ = models
    requests = ([Request(p, 8, SamplingParams(temperature=0.0, seed=0)) for p in _prompts(5, 1)]
                + [Request(p, 10, SamplingParams(temperature=1.0, seed=s), n=3 if s == 2 else 1)
                   for s, p in enumerate(_prompts(6, 2))])
    plain = complete(Engine(one, EngineConfig(slots=4, max_len=64)), _sharp(one), requests)
    engine = Engine(sharded, EngineConfig(slots=8, max_len=64, prefill_rows=4),
                    mesh=make_mesh(AXES))
    spread = complete(engine, _sharp(sharded), requests)
    for a, b in zip(plain, spread):
        assert [c.token_ids for c in a] == [c.token_ids for c in b]
        for x, y in zip(a, b):
            np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-3)


@pytest.mark.parametrize("read", ["xla", "tpu", "gpu"])
def test_a_long_slot_beside_short_ones_is_read_ragged_on_each_device(models, read, monkeypatch):
    """One 200-token prompt beside seven of 2 to 5 fill under a quarter of the 256-entry cache,
    so each device reads its own slots to their positions (the platform's `RAGGED_READS`
    under shard_map: on CPU XLA loops, and here the TPU and GPU Pallas kernels in interpret
    mode): the tokens one device decodes a slot at a time with the dense read, and on this
    mesh the dense read's tokens, log-probs within 1e-5."""
    one, sharded, _ = models
    if read != "xla":
        monkeypatch.setitem(engine_module.RAGGED_READS, "cpu", functools.partial(
            KERNELS[read], interpret=True))
    requests = [Request(p, 8, SamplingParams(temperature=0.0, seed=0))
                for p in _prompts(1, 9, low=200, high=200) + _prompts(7, 10, high=5)]
    plain = complete(Engine(one, EngineConfig(slots=1, max_len=256)), _sharp(one), requests)
    engine = Engine(sharded, EngineConfig(slots=8, max_len=256, prefill_rows=4),
                    mesh=make_mesh(AXES))
    steps, ragged = [], engine._generate_ragged
    monkeypatch.setattr(engine, "_generate_ragged", lambda *a: steps.append(1) or ragged(*a))
    spread = complete(engine, _sharp(sharded), requests)
    assert len(steps) >= 7
    monkeypatch.setattr(engine_module, "RAGGED_BELOW", 0.0)
    ragged_steps = len(steps)
    dense = complete(engine, _sharp(sharded), requests)
    assert len(steps) == ragged_steps  # the second run read densely
    for a, b, c in zip(plain, spread, dense):
        assert a[0].token_ids == b[0].token_ids == c[0].token_ids
        np.testing.assert_allclose(a[0].logprobs, b[0].logprobs, atol=1e-3)
        np.testing.assert_allclose(b[0].logprobs, c[0].logprobs, atol=1e-5, rtol=0)


def test_run_reads_documents_on_the_mesh_as_one_device_does():
    """The memory loop (`run`) of the shipped, trained memagent-tiny (whose memories depend on
    what it reads, unlike a random model's) over four synthetic documents, n 2 at temperature
    1, on 4 slots (so prompts wait): prefilled 4 a call on the mesh, one a call on one device:
    every turn's tokens, and log-probs within 1e-4."""
    from memagent_jax.engine.factory import load_model_section
    from memagent_jax.engine.model_section import ModelSection
    from memagent_jax.synthetic import tasks as synthetic

    section = ModelSection(path="memagent-tiny")
    tokenizer = section.load_tokenizer(required=True)
    budgets = MemAgentConfig.from_model(section.path)
    documents = [synthetic.make_sample("multikey", 1024, 9, i) for i in range(4)]
    results = []
    for mesh, rows in ((None, 1), (make_mesh(AXES), 4)):
        loaded = load_model_section(section, tokenizer, mesh)
        agent = MemAgent(budgets)
        runner = build_runner(agent, loaded.model, tokenizer,
                              EngineConfig(slots=4, prefill_rows=rows), mesh, loaded.stop_ids)
        samples = [agent.read(d.question, d.context) for d in documents]
        groups = runner.with_params(loaded.params).run(agent, samples,
                                                       SamplingParams(1.0, seed=3), n=2)
        results.append([t for group in groups for trajectory in group for t in trajectory.turns])
    assert [t.response_ids for t in results[0]] == [t.response_ids for t in results[1]]
    for a, b in zip(*results):
        np.testing.assert_allclose(a.response_logprobs, b.response_logprobs, atol=1e-4)
    assert len(results[0]) > 2 * len(documents) * 2
