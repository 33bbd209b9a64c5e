"""The DAPO learner: it learns a rewarded task from the engine's own samples, shares its arrays
with the engine, shards, skips non-finite updates and recomputes the sampler's log-probs."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from memagent_jax.engine.engine import Engine
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Request, complete
from memagent_jax.errors import UserError
from memagent_jax.models.loading import build_model, random_model
from memagent_jax.models.qwen import split_params
from memagent_jax.models.sharding import make_mesh, param_shardings
from memagent_jax.rl.advantages import group_advantages
from memagent_jax.rl.config import LearnerConfig
from memagent_jax.rl.dapo import informative_groups
from memagent_jax.rl.learner import Learner
from memagent_jax.rl.rows import rows_from_trajectories
from memagent_jax.rollout.agent_api import Trajectory, Turn
from tests.builders import LEARNER_MODEL, random_rows

pytestmark = pytest.mark.slow  # learner updates compiled


def _rollouts(engine, params, prompts, n, max_new_tokens, seed, temperature=1.0):
    """n samples per prompt from the engine -> (groups of single-turn Trajectories,
    completions)."""
    requests = [Request(p, max_new_tokens, SamplingParams(temperature=temperature,
                                                          seed=seed * 1000 + i), n=n)
                for i, p in enumerate(prompts)]
    results = complete(engine, params, requests)
    groups = [[Trajectory("", [Turn("final", list(p), c.token_ids, c.logprobs,
                                    c.finish_reason, "")]) for c in completions]
              for p, completions in zip(prompts, results)]
    return groups, results


def _host(tree):
    return jax.tree.map(np.asarray, tree)


def _sharded_copy(model, mesh):
    """The same weights as `model`, copied onto the mesh's parameter shardings."""
    params = jax.tree.map(np.asarray, split_params(model)[1])
    return build_model(model.config, jax.device_put(params, param_shardings(model.config, mesh)))


@pytest.mark.slow
def test_learns_a_rewarded_task_from_engine_rollouts():
    """Reward 1 when the reply holds token 7. The random policy finds it in ~20% of 4-token
    replies; DAPO (group advantages, dynamic sampling, clipped loss; no supervised loss) on the
    engine's own temperature-1 samples must lift the mean reward to >= 0.8."""
    target, vocab = 7, 32
    model = random_model(LEARNER_MODEL.replace(vocab_size=vocab), seed=0)
    engine = Engine(model, EngineConfig(slots=16, max_len=16, prefill_buckets=(8,)))
    learner = Learner(model, LearnerConfig(lr=2e-2, warmup_steps=0, micro_batch_tokens=128,
                                           bucket_lengths=(16,), ppo_epochs=2))
    rng = np.random.RandomState(0)
    curve = []
    for step in range(25):
        prompts = [tuple(int(t) for t in rng.randint(3, vocab, 6)) for _ in range(4)]
        groups, results = _rollouts(engine, learner.params, prompts, n=8, max_new_tokens=4,
                                    seed=step)
        rewards = np.array([[float(target in c.token_ids) for c in cs] for cs in results])
        curve.append(float(rewards.mean()))
        if len(curve) >= 2 and min(curve[-2:]) >= 0.8:
            break
        keep = informative_groups(rewards)
        if not keep.any():
            continue
        rows = rows_from_trajectories([g for g, k in zip(groups, keep) if k],
                                      group_advantages(rewards[keep]))
        metrics = learner.update(rows)
        assert metrics["skipped_updates"] == 0 and np.isfinite(metrics["loss"])
    print("mean reward per step:", curve)
    assert curve[0] < 0.4
    assert min(curve[-2:]) >= 0.8, curve


@pytest.mark.slow
def test_engine_decodes_with_its_copy_of_the_updated_arrays_compiled_once(compilations):
    """The learner splits weights over fsdp x tensor, the engine over tensor only: each run
    places the learner's current parameters in the engine's layout (`Engine.place`), by a
    program compiled at the first run, and decodes what the updated model says."""
    mesh = make_mesh({"fsdp": 4, "tensor": 2})
    model = _sharded_copy(random_model(LEARNER_MODEL, seed=1), mesh)
    engine = Engine(model, EngineConfig(slots=8, max_len=32, prefill_buckets=(16,)), mesh=mesh)
    learner = Learner(model, LearnerConfig(lr=5e-2, warmup_steps=0, micro_batch_tokens=256,
                                           bucket_lengths=(32,)), mesh=mesh)
    before = {jax.tree_util.keystr(p): a.sharding
              for p, a in jax.tree.leaves_with_path(learner.params)}
    prompts = [tuple(range(3 + i, 13 + i)) for i in range(4)]
    greedy = [Request(p, 8, SamplingParams(temperature=0.0, seed=0)) for p in prompts]
    old_tokens = [r[0].token_ids for r in complete(engine, learner.params, greedy)]

    stale = learner.params
    groups, results = _rollouts(engine, learner.params, prompts, n=4, max_new_tokens=8, seed=0)
    rewards = np.array([[float(np.mean(c.token_ids) > 32) for c in cs] for cs in results])
    metrics = learner.update(rows_from_trajectories(groups, group_advantages(rewards)))
    assert metrics["updates"] == 1 and metrics["skipped_updates"] == 0

    after = {jax.tree_util.keystr(p): a.sharding
             for p, a in jax.tree.leaves_with_path(learner.params)}
    assert after == before
    # the engine decodes with its copy of the learner's updated arrays: placing them, and
    # decoding, compile nothing new
    with compilations() as counter:
        new_tokens = [r[0].token_ids for r in complete(engine, learner.params, greedy)]
    assert counter.count == 0 and new_tokens != old_tokens
    # ... and decodes exactly what the updated model's full forward says, greedily
    forward = jax.jit(lambda p, ids: nnx.merge(learner.graphdef, p)(ids))  # right padding
    for prompt, tokens in zip(prompts, new_tokens):
        ids = list(prompt)
        for _ in range(len(tokens)):
            padded = np.zeros((1, 32), np.int32)
            padded[0, :len(ids)] = ids
            ids.append(int(np.argmax(forward(learner.params, padded)[0, len(ids) - 1])))
        assert tokens == ids[len(prompt):]

    # the parameters from before the update were donated to it: using them fails loudly
    with pytest.raises(ValueError, match="deleted"):
        complete(engine, stale, greedy)
    # parameters in any other layout are placed too, and decode the same tokens
    replicated = jax.tree.map(lambda x: jax.device_put(x, jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec())), learner.params)
    assert [r[0].token_ids for r in complete(engine, replicated, greedy)] == new_tokens


@pytest.mark.slow
def test_sharded_micro_batched_update_equals_unsharded_single_batch():
    """One update in micro-batches of 128 tokens (4 rows of 32) on fsdp=4 x tensor=2 equals
    it on one device as a single 32-row micro-batch: sharding and gradient accumulation change
    nothing (the loss is the token-mean over the whole mini-batch either way)."""
    rows = random_rows()
    config = LearnerConfig(lr=1e-3, warmup_steps=0, micro_batch_tokens=128, adam_eps=1e-3,
                           bucket_lengths=(16, 32))
    base = random_model(LEARNER_MODEL, seed=2)
    start = _host(split_params(base)[1])
    mesh = make_mesh({"fsdp": 4, "tensor": 2})
    sharded = Learner(_sharded_copy(base, mesh), config, mesh=mesh)
    shardings = jax.tree.map(lambda x: x.sharding, sharded.state()["params"])
    assert any(s.spec != jax.sharding.PartitionSpec(*[None] * len(s.spec))
               for s in jax.tree.leaves(shardings))
    single = Learner(base, dataclasses.replace(config, micro_batch_tokens=32 * 32,
                                               bucket_lengths=(32,)))
    assert len(rows) <= 32
    sharded_metrics = sharded.update(rows)
    single_metrics = single.update(rows)
    assert jax.tree.map(lambda x: x.sharding, sharded.state()["params"]) == shardings
    expected = _host(single.state()["params"])
    moved = max(float(np.abs(a - b).max())
                for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(start)))
    assert moved > 5e-4  # lr 1e-3: the update is well above the tolerance
    for a, b in zip(jax.tree.leaves(_host(sharded.state()["params"])),
                    jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, atol=2e-6, rtol=0)
    for key in ("loss", "grad_norm", "entropy", "clip_fraction"):
        assert sharded_metrics[key] == pytest.approx(single_metrics[key], rel=1e-4, abs=1e-7)


def test_non_finite_loss_skips_the_update():
    rows = random_rows(seed=3)
    learner = Learner(random_model(LEARNER_MODEL, seed=4),
                      LearnerConfig(lr=1e-2, warmup_steps=0, micro_batch_tokens=256,
                                    bucket_lengths=(32,), mini_batches=1))
    learner.update(rows)  # one real update, so the optimiser state is not all zeros
    params, opt_state, step = _host(learner.state()["params"]), \
        _host(learner.state()["opt_state"]), learner.step

    poisoned = random_rows(seed=3)
    poisoned.advantages[0] = np.nan
    metrics = learner.update(poisoned)
    assert metrics["skipped_updates"] == 1 and metrics["updates"] == 0
    assert learner.step == step
    for a, b in zip(jax.tree.leaves(_host(learner.state()["params"])), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(jax.tree.leaves(_host(learner.state()["opt_state"])),
                    jax.tree.leaves(opt_state)):
        np.testing.assert_array_equal(a, b)
    # the live parameters are the unchanged ones
    np.testing.assert_array_equal(np.asarray(learner.params["embed"]), params["embed"])

    # the accumulator was reset: the next finite batch updates normally
    metrics = learner.update(rows)
    assert metrics["skipped_updates"] == 0 and metrics["updates"] == 1
    assert np.isfinite(metrics["loss"]) and learner.step == step + 1


def test_rows_with_ids_outside_the_vocabulary_are_refused():
    """(the embedding lookup would read NaN for them and the update would be skipped as
    non-finite, saying nothing of why)"""
    learner = Learner(random_model(LEARNER_MODEL, seed=4),
                      LearnerConfig(micro_batch_tokens=256, bucket_lengths=(32,)))
    rows = random_rows(seed=3)
    rows.tokens[2, 1] = LEARNER_MODEL.vocab_size + 5
    with pytest.raises(ValueError, match=f"token id {LEARNER_MODEL.vocab_size + 5}, outside "
                                         "the model's vocabulary"):
        learner.update(rows)


def test_state_restore_round_trip_and_no_recompilation(compilations):
    rows = random_rows(seed=5)
    learner = Learner(random_model(LEARNER_MODEL, seed=6),
                      LearnerConfig(lr=1e-2, warmup_steps=2, micro_batch_tokens=256,
                                    bucket_lengths=(32,), mini_batches=2))
    learner.update(rows)
    first = learner.update(rows)
    assert first["updates"] == 2 and first["lr"] == pytest.approx(5e-3)  # 2nd warm-up step
    saved = _host(learner.state())
    with compilations() as counter:
        third = learner.update(rows)
    assert counter.count == 0, f"{counter.count} compilations on the third update"
    assert learner.step == 6 and learner.train_steps == 3 and third["lr"] == pytest.approx(1e-2)
    learner.restore(saved)
    assert learner.step == 4 and learner.train_steps == 2
    for a, b in zip(jax.tree.leaves(_host(learner.state())), jax.tree.leaves(saved)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(np.asarray(learner.params["lm_head"]),
                                  saved["params"]["lm_head"])


def test_recomputed_old_logprobs_match_the_rollout():
    """Sampled at temperature 1 and 0.7, the engine's logprobs (prefill + cached decode) equal
    the learner's full-forward recompute at the same temperature, its LM head applied to all
    positions at once or 10 at a time (rl/logprobs.py)."""
    model = random_model(LEARNER_MODEL, seed=7)
    engine = Engine(model, EngineConfig(slots=8, max_len=48, prefill_buckets=(16, 32)))
    rng = np.random.RandomState(8)
    prompts = [tuple(int(t) for t in rng.randint(3, 64, 5 + 6 * i)) for i in range(4)]
    for temperature, chunk in ((1.0, None), (0.7, 10)):
        learner = Learner(model, LearnerConfig(temperature=temperature, micro_batch_tokens=512,
                                               bucket_lengths=(64,), logit_chunk_tokens=chunk))
        groups, _ = _rollouts(engine, learner.params, prompts, n=3, max_new_tokens=12, seed=1,
                              temperature=temperature)
        rows = rows_from_trajectories(groups, np.zeros(12))
        recomputed = learner.logprobs(rows)
        mask = rows.loss_mask > 0
        assert mask.sum() == 12 * 12
        np.testing.assert_allclose(recomputed[mask], rows.rollout_logprobs[mask], atol=1e-4,
                                   rtol=0)
        assert np.all(recomputed[:, 0] == 0)
        assert np.all(recomputed[np.arange(rows.tokens.shape[1]) >= rows.lengths[:, None]] == 0)


def test_kl_reference_is_only_built_when_used():
    rows = random_rows(seed=9)
    config = dict(lr=1e-2, warmup_steps=0, micro_batch_tokens=256, bucket_lengths=(32,))
    plain = Learner(random_model(LEARNER_MODEL, seed=10), LearnerConfig(kl_coef=0.0, **config))
    assert plain._ref_params is None
    learner = Learner(random_model(LEARNER_MODEL, seed=10), LearnerConfig(kl_coef=0.5, **config))
    first = learner.update(rows)
    assert first["kl"] == pytest.approx(0.0, abs=1e-7)  # policy == reference before updating
    second = learner.update(rows)
    assert second["kl"] > 1e-6 and second["loss"] != second["pg_loss"]


@pytest.mark.slow
def test_train_step_builds_no_square_score_tensor():
    """Packed rows run without a mask, on the model's blocked causal attention with segment
    ids: at bucket length 1024 the compiled train step (forward and gradient) holds no
    [.., 1024, 1024] buffer."""
    length = 1024
    learner = Learner(random_model(LEARNER_MODEL, seed=11),
                      LearnerConfig(micro_batch_tokens=length, bucket_lengths=(length,)))
    hlo = learner.compiled(1, length)["train step"].as_text()
    assert f"{length},{length}]" not in hlo


@pytest.mark.parametrize("overrides, key", [
    ({"lr": 0.0}, "learner.lr"),
    ({"lr_schedule": "linear"}, "learner.lr_schedule"),
    ({"lr_schedule": "cosine"}, "learner.total_steps"),
    ({"old_logprobs": "cached"}, "learner.old_logprobs"),
    ({"dual_clip": 1.0}, "learner.dual_clip"),
    ({"micro_batch_tokens": 0}, "learner.micro_batch_tokens"),
])
def test_bad_config_names_the_key(overrides, key):
    with pytest.raises(UserError, match=key):
        LearnerConfig(**overrides)


def test_schedules_count_training_steps_as_verl():
    """verl's LambdaLR factors (verl/utils/torch_functional.py), evaluated by hand: constant
    min(1, k / warmup), so training step 0 runs at lr 0; cosine k / warmup during the warm-up,
    then (1 + m) / 2 + (1 - m) / 2 * cos(pi * progress)."""
    constant = LearnerConfig(lr=2.0, warmup_steps=4)
    assert [constant.learning_rate(k) for k in range(6)] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.0]
    assert LearnerConfig(lr=2.0, warmup_steps=0).learning_rate(0) == 2.0
    config = LearnerConfig(lr=1.0, warmup_steps=2, lr_schedule="cosine", total_steps=12,
                           min_lr_ratio=0.1)
    lrs = [config.learning_rate(k) for k in range(14)]
    assert lrs[:2] == [0.0, 0.5]
    assert lrs[2] == pytest.approx(1.0) and lrs[7] == pytest.approx(0.55)
    assert lrs[12] == pytest.approx(0.1) and lrs[13] == pytest.approx(0.1)


@pytest.mark.slow
def test_every_update_of_a_training_step_uses_its_learning_rate():
    """16 mini-batches in one step all run at that step's lr (verl steps its scheduler once
    per update_actor call); with warm-up the first step changes nothing."""
    rows = random_rows(seed=12, trajectories=16)
    learner = Learner(random_model(LEARNER_MODEL, seed=13),
                      LearnerConfig(lr=1e-2, warmup_steps=2, micro_batch_tokens=256,
                                    bucket_lengths=(32,), mini_batches=4))
    before = _host(learner.params)
    first = learner.update(rows)
    assert first["updates"] == 4 and first["lr"] == 0.0
    for a, b in zip(jax.tree.leaves(_host(learner.params)), jax.tree.leaves(before)):
        np.testing.assert_array_equal(a, b)
    second = learner.update(rows)
    assert second["updates"] == 4 and second["lr"] == pytest.approx(5e-3)
    assert learner.step == 8 and learner.train_steps == 2
