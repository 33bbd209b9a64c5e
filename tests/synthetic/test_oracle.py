"""Oracle trajectories of synthetic rows (synthetic/oracle.py; the supervised warm-up's
rows): the agent's own chunks and prompts, ideal memories, a boxed answer the strict
verifier accepts; and the SFT loss on them against a hand computation from the model's
logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memagent_jax.data.pipeline import Example
from memagent_jax.models.loading import random_model
from memagent_jax.rl.config import LearnerConfig
from memagent_jax.rl.learner import Learner
from memagent_jax.rl.rewards import strict_reward
from memagent_jax.rl.rows import rows_from_trajectories
from memagent_jax.synthetic import tasks as synthetic
from memagent_jax.synthetic.oracle import oracle_trajectory
from tests.builders import SFT_BUDGETS, SFT_MODEL


def _example(task, length, index):
    row = synthetic.train_row(synthetic.make_sample(task, length, 3, index), task, length, index)
    return Example(index, row["data_source"], row["prompt"][0]["content"], row["context"],
                   tuple(row["reward_model"]["ground_truth"]), row["extra_info"])


@pytest.mark.parametrize("task", synthetic.TASKS)
def test_an_oracle_trajectory_is_the_agents_loop_with_ideal_replies(agent, task):
    example = _example(task, 150, 0)
    trajectory = oracle_trajectory(agent, example)
    sample = agent.read(example.question, example.context, strict=False)
    tokenizer, prompts, eos = agent.tokenizer, agent.prompts, agent.tokenizer.eos_token_id
    assert len(sample.chunks) == 3 and [t.kind for t in trajectory.turns] == [
        "update"] * 3 + ["final"]
    texts = [tokenizer.decode(c) for c in sample.chunks]
    memories = synthetic.oracle_memories(texts, example.extra_info["facts"])
    memory = prompts.initial_memory
    for turn, chunk, expected in zip(trajectory.turns, sample.chunks, memories):
        # The prompt the agent builds from the previous reply (its ids without end-of-text).
        assert turn.prompt_ids == prompts.update(sample.problem_ids, memory, chunk)
        assert turn.response_ids[-1] == eos and eos not in turn.response_ids[:-1]
        assert len(turn.response_ids) <= SFT_BUDGETS.max_memory_tokens
        memory = turn.response_ids[:-1]
        want = expected.replace("\n", " ") if expected else "No previous memory"
        assert turn.reply.strip().replace(" .", ".") == want.replace(" .", ".")
    final = trajectory.turns[-1]
    assert final.prompt_ids == prompts.final(sample.problem_ids, memory)
    assert strict_reward(final.reply, list(example.ground_truths)) == 1.0
    # It restates the facts it answers from, then boxes the answer (docs/synthetic.md).
    restated = memories[-1].replace("\n", " ").replace(" .", ".")
    assert final.reply.strip().replace(" .", ".").startswith(restated) and restated
    # The last memory holds every fact the answer needs.
    assert all(f["text"] in memories[-1] for f in example.extra_info["facts"] if f["needed"])


def test_a_row_without_facts_is_one_clear_error(agent):
    from memagent_jax.errors import UserError
    plain = Example(5, "hotpotqa", "q ?", "the code of x is y .", ("y",), {})
    with pytest.raises(UserError, match="row 5 .*no extra_info.facts.*data synthetic"):
        oracle_trajectory(agent, plain)


@pytest.mark.slow
def test_the_sft_loss_is_the_token_mean_negative_log_likelihood_of_the_replies(agent):
    trajectories = [oracle_trajectory(agent, _example(task, 120, i))
                    for task in synthetic.TASKS for i in range(2)]
    rows = rows_from_trajectories(trajectories, np.ones(len(trajectories)))
    model = random_model(SFT_MODEL, seed=1)
    # By hand: log-softmax of the model's logits at each reply token's previous position.
    logits = np.asarray(jax.jit(lambda m, t: m(t))(model, jnp.asarray(rows.tokens)))
    logp = logits[:, :-1] - jax.nn.logsumexp(logits[:, :-1], axis=-1, keepdims=True)
    chosen = np.take_along_axis(np.asarray(logp), rows.tokens[:, 1:, None], axis=-1)[..., 0]
    expected = -(chosen * rows.loss_mask[:, 1:]).sum() / rows.loss_mask.sum()

    learner = Learner(model, LearnerConfig(loss="sft", lr=1e-2, warmup_steps=0, kl_coef=0.5,
                                           micro_batch_tokens=2048, bucket_lengths=(256,),
                                           logit_chunk_tokens=64))
    first = learner.update(rows)
    assert first["loss"] == pytest.approx(expected, rel=1e-5)
    assert first["pg_loss"] == first["loss"] and first["clip_fraction"] == 0.0
    for _ in range(3):
        last = learner.update(rows)
    assert last["loss"] < first["loss"] - 0.5  # it learns the oracle's replies
