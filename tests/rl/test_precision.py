"""Training precision: float32 master weights, bfloat16 compute, and the engine's bf16 copy.

verl's actor keeps float32 weights and AdamW moments and computes in bf16 (FSDP mixed
precision), and vLLM decodes from a bf16 copy synced after each update; these tests pin the
same split here, end to end through both shipped 7B configs with the tiny preset substituted.
"""

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memagent_jax.data.needle import write_task
from memagent_jax.engine.engine import Engine
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.errors import UserError
from memagent_jax.models.config import ModelConfig
from memagent_jax.models.loading import random_model
from memagent_jax.models.sharding import make_mesh
from memagent_jax.rl.config import LearnerConfig, load_train_config
from memagent_jax.rl.learner import Learner
from memagent_jax.rl.rows import rows_from_trajectories
from memagent_jax.rl.trainer import Trainer
from memagent_jax.rollout.agent_api import Trajectory, Turn

pytestmark = pytest.mark.slow  # training steps in two precisions

CONFIG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8)
ROOT = str(Path(__file__).resolve().parents[2])


def _rows(seed=0, trajectories=8):
    rng = np.random.RandomState(seed)
    flat = []
    for _ in range(trajectories):
        turns = [Turn("update", list(rng.randint(3, 64, 6)), list(rng.randint(3, 64, 5)),
                      list(-rng.uniform(2, 5, 5)), "length", "") for _ in range(2)]
        flat.append(Trajectory("", turns))
    return rows_from_trajectories(flat, rng.randn(trajectories))


def _learner(compute_dtype, mesh=None, **overrides):
    model = random_model(CONFIG, seed=1, dtype=compute_dtype, mesh=mesh)
    config = dict(lr=1e-3, warmup_steps=0, micro_batch_tokens=128, bucket_lengths=(16,))
    return Learner(model, LearnerConfig(**{**config, **overrides}), mesh=mesh)


def _host(tree):
    return [np.asarray(x, np.float32) for x in jax.tree.leaves(tree)]


def test_bf16_compute_step_matches_the_f32_step():
    """One update with float32 weights computing in bf16 against the all-float32 update:
    same loss within bf16's precision, same parameter change within a few percent (adam_eps 1
    makes the change proportional to the gradient, so the gradient is what is compared)."""
    rows = _rows()
    deltas, losses = {}, {}
    for dtype in ("float32", "bfloat16"):
        learner = _learner(dtype, adam_eps=1.0)
        before = _host(learner.params)
        losses[dtype] = learner.update(rows)["pg_loss"]
        after = _host(learner.params)
        assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(learner.params))
        deltas[dtype] = np.concatenate([(a - b).ravel() for a, b in zip(after, before)])
    assert losses["bfloat16"] == pytest.approx(losses["float32"], rel=2e-2, abs=1e-3)
    error = np.linalg.norm(deltas["bfloat16"] - deltas["float32"])
    assert error / np.linalg.norm(deltas["float32"]) < 5e-2


def test_parameters_change_under_a_small_learning_rate():
    """lr 1e-6 on N(0, 0.02) weights: float32 master weights take the updates; the same
    updates added to bf16 weights would round away (one bf16 step at 0.02 is ~1.2e-4). (The
    few float32 weights left unchanged are embedding rows of tokens no row holds: their only
    update is the weight decay, 1e-8 x w.)"""
    learner = _learner("bfloat16", lr=1e-6, mini_batches=4)
    before = np.concatenate([x.ravel() for x in _host(learner.params)])
    for _ in range(4):
        learner.update(_rows(seed=2))
    after = np.concatenate([x.ravel() for x in _host(learner.params)])
    assert (after != before).mean() > 0.95
    bf16 = jnp.asarray(before, jnp.bfloat16)
    in_bf16 = bf16 + jnp.asarray(after - before, jnp.bfloat16)
    assert float(jnp.mean(in_bf16 != bf16)) < 0.1


def test_the_engine_copy_is_the_cast_of_the_learners_params_in_its_layout():
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    model = random_model(CONFIG, seed=1, dtype="bfloat16", mesh=mesh)
    learner = Learner(model, LearnerConfig(lr=1e-3, warmup_steps=0, micro_batch_tokens=128,
                                           bucket_lengths=(16,)), mesh=mesh)
    engine = Engine(model, EngineConfig(slots=4, max_len=32), mesh=mesh)
    learner.update(_rows(seed=3))
    copy = engine.place(learner.params)
    for master, cast, want in zip(jax.tree.leaves(learner.params), jax.tree.leaves(copy),
                                  jax.tree.leaves(engine.abstract_params)):
        assert cast.dtype == jnp.bfloat16 and cast.sharding == want.sharding
        np.testing.assert_array_equal(np.asarray(cast),
                                      np.asarray(master).astype(jnp.bfloat16))
    learner.update(_rows(seed=4))  # the copy is not donated: it still reads, now stale
    stale = jax.tree.leaves(copy)[0]
    assert not stale.is_deleted()
    fresh = jax.tree.leaves(engine.place(learner.params))[0]
    assert not np.array_equal(np.asarray(stale), np.asarray(fresh))


def test_f32_compute_on_one_device_hands_the_learners_own_arrays_to_the_engine():
    learner = _learner("float32")
    engine = Engine(random_model(CONFIG, seed=1), EngineConfig(slots=4, max_len=32))
    assert engine.place(learner.params) is learner.params


def test_bf16_master_weights_are_refused():
    with pytest.raises(ValueError, match="float32 master weights"):
        Learner(random_model(CONFIG.replace(dtype="bfloat16"), dtype="bfloat16"),
                LearnerConfig())


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(str(tmp_path_factory.mktemp("needle") / "task"), train_size=16,
                      val_size=2, seed=3)


def _small(task, root, mesh, preset="tiny"):
    """Overrides that shrink a shipped config to a tiny preset and a needle task, keeping
    everything else (bf16 compute over float32 master weights, KL, per-rank loss weighting
    over 32 ranks, 16 mini-batches, warm-up, remat, validation n=4)."""
    return [
        "model.path=null", f"model.preset={preset}", f"model.tokenizer={task['tokenizer']}",
        "model.attention=xla", f"mesh={mesh}", f"data.train=[{task['train']}]",
        f"data.val={task['val']}", "validation.size=2", "validation.every=2",
        "memagent.chunk_tokens=32", "memagent.max_memory_tokens=12",
        "memagent.max_final_tokens=8", "memagent.max_problem_tokens=8",
        "engine.slots=16", "engine.prefill_buckets=[256]", "rollout.n=2",
        "learner.micro_batch_tokens=8192", "learner.bucket_lengths=[256]",
        "steps=2", "prompts_per_step=2", f"output_dir={root}", f"checkpoint.dir={root}/ckpt",
        "compilation_cache_dir=null", "distributed=false",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("name, mesh, preset", [
    ("qwen2.5-7b_gpu8.yaml", "{data: 2, fsdp: 2, tensor: 2}", "tiny"),
    ("qwen2.5-7b_tpu_v5p.yaml", "{data: 2, fsdp: 4, tensor: 1}", "tiny"),
    # Its own mesh (tensor 4 over tiny-qwen3's 4 query heads; its 2 KV heads replicated), with
    # the head norms; the TPU config's 4B mesh (data 4 x tensor 4) needs 16 devices.
    ("qwen3-4b_gpu8.yaml", "{data: 2, fsdp: 1, tensor: 4}", "tiny-qwen3"),
])
def test_shipped_configs_train_in_bf16_compute(name, mesh, preset, task, tmp_path):
    """The shipped 7B and 4B configs, a tiny preset substituted, run two steps end to end: master
    weights and checkpoints in float32, the engine decoding a bf16 copy, the first training
    step at lr 0 (warm-up counted in training steps), the second at lr / 20, and the
    rollout-vs-learner mismatch in TensorBoard non-zero."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = load_train_config(os.path.join(ROOT, "configs", "train", name),
                               _small(task, tmp_path, mesh, preset))
    assert (config.model.param_dtype, config.model.compute_dtype) == ("float32", "bfloat16")
    trainer = Trainer(config)
    engine = trainer.runner.scheduler.engine
    assert {a.dtype for a in jax.tree.leaves(engine.abstract_params)} == {jnp.dtype("bfloat16")}
    assert engine.dtype == jnp.bfloat16
    # it decodes a bf16 copy of the masters, in its own layout
    placed = engine.place(trainer.learner.params)
    assert {a.dtype for a in jax.tree.leaves(placed)} == {jnp.dtype("bfloat16")}
    trainer.run()
    records = _records(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["learner/lr"] == 0.0
    assert records[1]["learner/lr"] == pytest.approx(config.learner.lr / 20)
    assert all(np.isfinite(r["learner/loss"]) and r["learner/skipped_updates"] == 0
               for r in records)
    assert "val/accuracy" in records[1]
    assert {x.dtype for x in jax.tree.leaves(trainer.learner.state()["params"])} == {
        jnp.dtype("float32")}
    assert trainer.checkpointer.latest_step() == 2
    # The engine decodes from the bf16 copy one cached token at a time, the learner runs a
    # blocked bf16 forward from the float32 weights: they round differently, and TensorBoard
    # shows by how much, every step. Seen: mean |delta log p| 5-6e-4 and k3 2-3e-7 here,
    # against 1.6e-7 and 4e-14 for the float32 run of tests/rl/test_trainer.py.
    events = EventAccumulator(os.path.join(tmp_path, "logs", "tensorboard"))
    events.Reload()
    for tag, least in (("learner/rollout_logprob_abs_diff", 1e-4),
                       ("learner/rollout_kl_k3", 1e-8)):
        assert [e.step for e in events.Scalars(tag)] == [1, 2]
        assert all(e.value > least for e in events.Scalars(tag)), tag


def _records(output_dir):
    with open(os.path.join(output_dir, "logs", "steps.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_training_refuses_bf16_master_weights_in_one_line(task):
    with pytest.raises(UserError, match="model.param_dtype.*float32 master weights"):
        load_train_config(os.path.join(ROOT, "configs", "train", "tiny_cpu.yaml"),
                          ["model.param_dtype=bfloat16", f"model.tokenizer={task['tokenizer']}"])
