"""The learner's micro-batches (rl/batching.py): plans of static shapes that hold every row
once, within the token budget; packed (`learner.pack`) with less padding, the log-prob pass
and update equal to the unpacked ones under both loss aggregations; one schema for the
gathered arrays and the compiled shapes."""

import dataclasses

import jax
import numpy as np
import pytest

from memagent_jax.errors import UserError
from memagent_jax.models.loading import random_model
from memagent_jax.models.sharding import make_mesh
from memagent_jax.rl.batching import (
    abstract_batch,
    batch_fields,
    gather,
    padded_fraction,
    plan_sequences,
    scatter,
)
from memagent_jax.rl.config import LearnerConfig
from memagent_jax.rl.learner import Learner
from memagent_jax.rl.rows import TrainingRows
from tests.builders import LEARNER_MODEL, random_rows


def test_packed_plan_holds_every_row_once_within_the_budget():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 300, 200)
    tokens = np.zeros((200, 300), np.int32)
    for r, n in enumerate(lengths):
        tokens[r, :n] = rng.integers(1, 1000, n)
    buckets = (64, 128, 256, 512)
    packed = plan_sequences(lengths, range(200), buckets, pack=True, tokens=2048,
                            row_multiple=2)
    plain = plan_sequences(lengths, range(200), buckets, pack=False, tokens=2048,
                           row_multiple=2)
    for plan in packed:
        assert plan.length in buckets and plan.row.size <= 2048 and plan.sequences % 2 == 0
    back = np.zeros_like(tokens)
    rows = _rows(tokens, lengths)
    for plan in packed:
        scatter(plan, gather(plan, rows, ["tokens"], {})["tokens"], back)
    np.testing.assert_array_equal(back, tokens)  # every token back in its place
    counts = np.bincount(np.concatenate([p.row[(p.row >= 0)] for p in packed]), minlength=200)
    np.testing.assert_array_equal(counts, lengths)
    assert padded_fraction(packed) < 0.1 < padded_fraction(plain)
    with pytest.raises(UserError, match="exceeds the largest bucket"):
        plan_sequences(np.array([600]), [0], buckets, pack=True, tokens=2048)


def _rows(tokens, lengths):
    """TrainingRows of these tokens, prompts of one token, no advantages."""
    r = len(tokens)
    mask = (np.arange(tokens.shape[1])[None] < lengths[:, None]).astype(np.float32)
    mask[:, 0] = 0
    return TrainingRows(tokens, mask, np.zeros(r, np.float32), np.zeros(tokens.shape, np.float32),
                        np.ones(r, np.int32), lengths.astype(np.int32),
                        np.arange(r, dtype=np.int32),
                        np.zeros(r, np.int32), np.zeros(r, bool))


def test_unpacked_micro_batches_of_static_shapes_cover_every_row_once():
    rng = np.random.RandomState(1)
    lengths = np.concatenate([rng.randint(5, 60, 37), rng.randint(100, 500, 11)])
    plans = plan_sequences(lengths, range(len(lengths)), (64, 128, 256, 512), pack=False,
                           tokens=1024, row_multiple=2)
    heads = [p.row[:, 0] for p in plans]
    seen = np.concatenate([h[h >= 0] for h in heads])
    assert sorted(seen) == list(range(len(lengths)))
    for plan in plans:
        assert plan.sequences % 2 == 0 and plan.row.size <= 1024
        assert plan.length in (64, 128, 256, 512) and not plan.packed
        assert lengths[plan.row[:, 0][plan.row[:, 0] >= 0]].max() <= plan.length
    assert sum(lengths) / sum(p.row.size for p in plans) > 0.5  # padding does not dominate


@pytest.mark.parametrize("pack", [True, False])
def test_a_gathered_batch_has_the_declared_shapes(pack):
    """The arrays `gather` gives for the learner's fields are what `abstract_batch` (the
    compiled train step's shapes) declares, name for name."""
    rows = random_rows(seed=3, trajectories=8)
    config = dataclasses.replace(CONFIG, pack=pack, rollout_correction=2.0)
    names = batch_fields(config, reference=True)
    assert ("segment_ids" in names) == pack and {"ref_logprobs", "is_weights"} <= set(names)
    plan = plan_sequences(rows.lengths, range(len(rows)), (32,), pack=pack, tokens=256)[0]
    given = {"old_logprobs": rows.rollout_logprobs, "ref_logprobs": rows.rollout_logprobs,
             "is_weights": np.ones_like(rows.rollout_logprobs),
             "row_weights": np.ones(len(rows), np.float32)}
    batch = gather(plan, rows, names, given)
    width = batch["positions"].shape[1]
    declared = abstract_batch(names, plan.sequences, plan.length, width, None)
    assert list(batch) == list(declared)
    for name, array in batch.items():
        assert (array.shape, array.dtype) == (declared[name].shape, declared[name].dtype), name
    # Each row's advantage on every token it fills, and nothing on padding.
    filled = plan.row >= 0
    np.testing.assert_array_equal(batch["advantages"][filled], rows.advantages[plan.row[filled]])
    assert not batch["advantages"][~filled].any() and not batch["tokens"][~filled].any()


@pytest.fixture(scope="module")
def rows():
    """32 rows of 6-18 tokens: unpacked, every micro-batch is 8 rows of 32 tokens (two per
    mini-batch); packed, 8 sequences of 32 (one per mini-batch): one compile of each."""
    rows = random_rows(seed=3, trajectories=16)
    return dataclasses.replace(rows, **{f.name: getattr(rows, f.name)[:32]
                                        for f in dataclasses.fields(rows)})


CONFIG = LearnerConfig(lr=1e-3, warmup_steps=0, adam_eps=1e-3, micro_batch_tokens=256,
                       bucket_lengths=(32,), mini_batches=2, kl_coef=0.1)


@pytest.mark.slow
@pytest.mark.parametrize("agg", [{"loss_agg": "global_token_mean"},
                                 {"loss_agg": "per_rank_token_mean", "loss_agg_ranks": 2}])
def test_packed_logprobs_and_update_equal_the_unpacked_ones(rows, agg):
    """The log-prob pass, then one update (old and reference log-probs recomputed, two
    mini-batches): same metrics and same new parameters."""
    learners = {pack: Learner(random_model(LEARNER_MODEL, seed=4),
                              dataclasses.replace(CONFIG, pack=pack, **agg))
                for pack in (True, False)}
    logprobs = {pack: learner.logprobs(rows) for pack, learner in learners.items()}
    assert np.abs(logprobs[True]).sum() > 0
    np.testing.assert_allclose(logprobs[True], logprobs[False], atol=1e-5)
    metrics = {pack: learner.update(rows) for pack, learner in learners.items()}
    for name in ("loss", "pg_loss", "kl", "entropy", "grad_norm"):
        assert abs(metrics[True][name] - metrics[False][name]) <= 1e-5 * max(
            1.0, abs(metrics[False][name])), name
    for a, b in zip(jax.tree.leaves(learners[True].params),
                    jax.tree.leaves(learners[False].params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:packed rows under attention 'cudnn' off GPU")
def test_cudnn_learner_packs_on_the_mesh_as_the_blocked_kernel_does(rows):
    """attention 'cudnn' with learner.pack on data 2 x fsdp 2 x tensor 2: the packed rows
    attend through jax's Triton flash kernel (interpret mode here) under shard_map, and the
    log-prob pass and an update equal those of the blocked XLA kernel on the same mesh."""
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    learners = {attention: Learner(random_model(LEARNER_MODEL, seed=4, attention=attention,
                                                mesh=mesh),
                                   dataclasses.replace(CONFIG, pack=True), mesh)
                for attention in ("cudnn", "xla")}
    logprobs = {name: learner.logprobs(rows) for name, learner in learners.items()}
    np.testing.assert_allclose(logprobs["cudnn"], logprobs["xla"], atol=1e-5)
    metrics = {name: learner.update(rows) for name, learner in learners.items()}
    for name in ("loss", "pg_loss", "kl", "entropy", "grad_norm"):
        assert abs(metrics["cudnn"][name] - metrics["xla"][name]) <= 1e-5 * max(
            1.0, abs(metrics["xla"][name])), name
    for a, b in zip(jax.tree.leaves(learners["cudnn"].params),
                    jax.tree.leaves(learners["xla"].params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


@pytest.mark.parametrize("row_multiple", [2, 4])
def test_a_packed_plan_on_a_mesh_keeps_to_its_token_budget(row_multiple):
    """Each micro-batch holds at least `row_multiple` sequences (one a data shard), so packing
    fills sequences only as long as row_multiple of them fit the budget: a bucket as long as
    the whole budget would give each micro-batch row_multiple times the tokens asked for."""
    lengths = np.random.default_rng(2).integers(5, 64, 100)
    buckets, tokens = (64, 128, 256), 256
    for plan in plan_sequences(lengths, range(100), buckets, pack=True, tokens=tokens,
                               row_multiple=row_multiple):
        assert plan.sequences * plan.length <= tokens, (plan.sequences, plan.length)
        assert plan.sequences % row_multiple == 0
