"""The supervised warm-up: oracle trajectories of synthetic rows (the agent's own chunks and
prompts, ideal memories, a boxed answer the strict verifier accepts), the SFT loss against a
hand computation from the model's logits, and training steps through the trainer."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memagent_jax.cli import main
from memagent_jax.data import synthetic
from memagent_jax.data.needle import write_tokenizer
from memagent_jax.data.pipeline import Example
from memagent_jax.errors import ConfigError
from memagent_jax.models import ModelConfig, random_model
from memagent_jax.rl.config import load_train_config
from memagent_jax.rl.learner import Learner, LearnerConfig
from memagent_jax.rl.rewards import strict_reward
from memagent_jax.rl.rows import rows_from_trajectories
from memagent_jax.rl.sft import (carry_trajectories, copy_trajectories, fact_trajectories,
                                 filler_trajectories, oracle_trajectory, recall_trajectories,
                                 warmup_trajectories)
from memagent_jax.rollout.agent import build_agent
from memagent_jax.rollout.engine import EngineConfig
from memagent_jax.rollout.memagent import MemAgentConfig, Trajectory, Turn
from memagent_jax.tokenizer import load_tokenizer

from tests import multiprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = ModelConfig(vocab_size=4096, hidden_size=32, intermediate_size=48, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8)
BUDGETS = MemAgentConfig(chunk_tokens=64, max_memory_tokens=40, max_final_tokens=8,
                         max_problem_tokens=16)


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    tokenizer = load_tokenizer(write_tokenizer(str(tmp_path_factory.mktemp("tok")),
                                               synthetic.vocabulary()))
    model = random_model(MODEL, seed=0)
    return build_agent(model, tokenizer, BUDGETS, EngineConfig(slots=4), None,
                       (tokenizer.eos_token_id,))


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
        assert len(turn.response_ids) <= BUDGETS.max_memory_tokens
        memory = turn.response_ids[:-1]
        want = expected.replace("\n", " ") if expected else "No previous memory"
        assert turn.reply.replace(" .", ".") == want.replace(" .", ".")
    final = trajectory.turns[-1]
    assert final.prompt_ids == prompts.final(sample.problem_ids, memory)
    assert strict_reward(final.reply, list(example.ground_truths)) == 1.0
    # It restates the facts it answers from, then boxes the answer (docs/synthetic.md).
    restated = memories[-1].replace("\n", " ").replace(" .", ".")
    assert final.reply.replace(" .", ".").startswith(restated) and restated
    # The last memory holds every fact the answer needs.
    assert all(f["text"] in memories[-1] for f in example.extra_info["facts"] if f["needed"])


def test_a_row_without_facts_is_one_clear_error(agent):
    from memagent_jax.errors import UserError
    plain = Example(5, "hotpotqa", "q ?", "the code of x is y .", ("y",), {})
    with pytest.raises(UserError, match="row 5 .*no extra_info.facts.*data synthetic"):
        oracle_trajectory(agent, plain)


def test_the_sft_loss_is_the_token_mean_negative_log_likelihood_of_the_replies(agent):
    trajectories = [oracle_trajectory(agent, _example(task, 120, i))
                    for task in synthetic.TASKS for i in range(2)]
    rows = rows_from_trajectories(trajectories, np.ones(len(trajectories)))
    model = random_model(MODEL, seed=1)
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


def test_copy_rows_repeat_a_seeded_span_of_task_words(agent):
    tokenizer = agent.tokenizer
    first = copy_trajectories(tokenizer, 3, 5, seed=1)
    words = set(tokenizer.convert_tokens_to_ids(synthetic.words().all()))
    for trajectory in first:
        (turn,) = trajectory.turns
        assert len(turn.prompt_ids) == 5 and set(turn.prompt_ids) <= words
        assert turn.response_ids == [*turn.prompt_ids, tokenizer.eos_token_id]
        assert len(turn.response_logprobs) == 6
    prompts = lambda ts: [t.turns[0].prompt_ids for t in ts]  # noqa: E731
    assert prompts(copy_trajectories(tokenizer, 3, 5, seed=1)) == prompts(first)
    assert prompts(copy_trajectories(tokenizer, 3, 5, seed=2)) != prompts(first)


def test_copy_rows_of_varying_length_position_and_distance(agent):
    """copy_span_min varies the span's length, copy_prefix puts other words before the span and
    copy_gap between the span and its copy: the copy is then at many positions and distances
    back, not one (docs/synthetic.md)."""
    tokenizer = agent.tokenizer
    rows = [t.turns[0] for t in copy_trajectories(tokenizer, 40, 12, seed=3, min_span=2,
                                                   gap=30, prefix=20)]
    spans = [turn.response_ids[:-1] for turn in rows]
    starts = []
    for turn, span in zip(rows, spans):
        prompt = turn.prompt_ids
        found = [i for i in range(len(prompt) - len(span) + 1)
                 if prompt[i:i + len(span)] == span]
        assert found, "the reply is not a span of the prompt"
        starts.append(found[0])
    gaps = [len(turn.prompt_ids) - start - len(span)
            for turn, start, span in zip(rows, starts, spans)]
    lengths = [len(span) for span in spans]
    assert min(lengths) >= 2 and max(lengths) <= 12 and len(set(lengths)) > 5
    assert min(starts) >= 0 and max(starts) <= 20 and len(set(starts)) > 10
    assert min(gaps) >= 0 and max(gaps) <= 30 and len(set(gaps)) > 8
    assert sum(g <= 2 for g in gaps) >= 10, "short gaps (the final turn's copies) are rare"


def test_uniform_copy_rows_are_the_rows_steps_0_to_2_were_trained_on(agent):
    """copy_draw "uniform" draws what the code the recipe's steps 0-2 ran with drew (commit
    abc1437: span lengths and gaps uniform); the default, log-uniform, draws other rows, with
    which step 0 did not learn to copy in its 300 steps (docs/synthetic.md)."""
    def lengths_and_gaps(rows):
        return [(len(r.turns[0].response_ids) - 1,
                 len(r.turns[0].prompt_ids) - len(r.turns[0].response_ids) + 1) for r in rows]

    as_run = [(44, 338), (10, 96), (8, 263), (57, 187), (14, 367), (46, 16), (50, 277),
              (38, 263)]   # abc1437's copy_trajectories(tokenizer, 8, 64, 5, 4, 384)
    uniform = copy_trajectories(agent.tokenizer, 8, 64, 5, 4, 384, draw="uniform")
    assert lengths_and_gaps(uniform) == as_run
    assert uniform[0].turns[0].prompt_ids[:3] == [3205, 143, 3217]
    assert lengths_and_gaps(copy_trajectories(agent.tokenizer, 8, 64, 5, 4, 384)) != as_run
    with pytest.raises(ValueError, match="draw must be one of"):
        copy_trajectories(agent.tokenizer, 1, 64, 5, 4, 384, draw="normal")


def test_recall_rows_repeat_seeded_facts_in_another_order(agent):
    tokenizer = agent.tokenizer
    first = recall_trajectories(tokenizer, 4, 6, seed=1)
    for trajectory in first:
        (turn,) = trajectory.turns
        facts = lambda ids: [f.strip() for f in tokenizer.decode(ids).split(".")]  # noqa: E731
        prompt, reply = facts(turn.prompt_ids), facts(turn.response_ids[:-1])
        assert turn.response_ids[-1] == tokenizer.eos_token_id
        assert sorted(prompt) == sorted(reply) and len(prompt) == 7  # 6 facts and ""
        assert prompt != reply or len(set(prompt)) < 7
        for fact in prompt[:-1]:  # every fact is one of the tasks' two forms
            *form, subject, value = fact.split()
            assert form in (["the", "code", "of"], ["the", "city", "of"])
    same = recall_trajectories(tokenizer, 4, 6, seed=1)
    assert [t.turns[0].response_ids for t in same] == [t.turns[0].response_ids for t in first]
    assert (recall_trajectories(tokenizer, 4, 6, seed=2)[0].turns[0].prompt_ids
            != first[0].turns[0].prompt_ids)


def _memory_and_chunk(agent, trajectory):
    """(memory ids, chunk ids) of a one-turn update trajectory, asserting that its prompt is
    the agent's update prompt around them, with a chunk of chunk_tokens."""
    (turn,) = trajectory.turns
    prompts = agent.prompts
    problem = agent.read(trajectory.problem, "a", strict=False).problem_ids
    empty = prompts.update(problem, [], [])
    at = next(i for i, (a, b) in enumerate(zip(turn.prompt_ids, empty)) if a != b)
    memory = turn.prompt_ids[at:at + len(turn.prompt_ids) - len(empty) - BUDGETS.chunk_tokens]
    without = prompts.update(problem, memory, [])
    at = next(i for i, (a, b) in enumerate(zip(turn.prompt_ids, without)) if a != b)
    chunk = turn.prompt_ids[at:at + BUDGETS.chunk_tokens]
    assert prompts.update(problem, memory, chunk) == turn.prompt_ids
    return memory, chunk


def test_filler_rows_are_update_turns_without_a_fact_that_keep_the_oracles_memory(agent):
    tokenizer, prompts = agent.tokenizer, agent.prompts
    rows = filler_trajectories(agent, 40, seed=3)
    kept = 0
    for trajectory in rows:
        (turn,) = trajectory.turns
        assert turn.kind == "update" and turn.response_ids[-1] == tokenizer.eos_token_id
        memory = turn.response_ids[:-1]
        # the prompt is the agent's update prompt around this memory and one chunk
        given, chunk = _memory_and_chunk(agent, trajectory)
        assert given == memory
        assert not {"code", "city"} & set(tokenizer.decode(chunk).split())  # no fact in it
        if memory == list(prompts.initial_memory):
            continue
        kept += 1
        facts = [f.split() for f in tokenizer.decode(memory).split(".") if f.strip()]
        if trajectory.problem.startswith("what is the code of") and "city" not in (
                trajectory.problem):  # multikey: the asked key's fact and nothing else
            key = trajectory.problem.split()[-2]
            assert len(facts) == 1 and facts[0][:4] == ["the", "code", "of", key]
        assert all(f[:3] in (["the", "code", "of"], ["the", "city", "of"]) for f in facts)
    assert 10 <= kept <= 30  # empty memories and kept facts both occur
    again = filler_trajectories(agent, 40, seed=3)
    assert [t.turns[0].prompt_ids for t in again] == [t.turns[0].prompt_ids for t in rows]
    other = filler_trajectories(agent, 40, seed=4)
    assert [t.turns[0].prompt_ids for t in other] != [t.turns[0].prompt_ids for t in rows]


def test_held_filler_rows_carry_the_facts_the_question_needs(agent):
    tokenizer = agent.tokenizer
    rows = filler_trajectories(agent, 24, seed=3, memory="held")
    for trajectory in rows:
        (turn,) = trajectory.turns
        given, chunk = _memory_and_chunk(agent, trajectory)
        assert given == turn.response_ids[:-1]  # kept as it was
        assert not {"code", "city"} & set(tokenizer.decode(chunk).split())
        facts = _facts(tokenizer.decode(given))
        question = trajectory.problem.split()
        if "city" not in question:  # multikey: the asked key's fact alone
            assert len(facts) == 1 and facts[0][3] == question[-2]
        else:  # twohop: the person's city and that city's code, both read by the last chunk
            (city,) = [f[4] for f in facts if f[1] == "city" and f[3] == question[-2]]
            assert any(f[1] == "code" and f[3] == city for f in facts)
    assert {"city" in t.problem for t in rows} == {False, True}


def test_cut_carry_rows_are_chunks_of_longer_filler_that_start_and_end_mid_sentence(agent):
    # A long document's chunks are cut every chunk_tokens tokens, mostly inside sentences;
    # uncut rows are whole sentences, the last one's full stop ending the chunk.
    size = agent.config.chunk_tokens
    whole = filler_trajectories(agent, 24, seed=3, memory="held")
    cut = filler_trajectories(agent, 24, seed=3, memory="held", cut=True)
    ends, starts = 0, set()
    for index, (a, b) in enumerate(zip(whole, cut)):
        memory, chunk = _memory_and_chunk(agent, b)
        assert (memory, b.problem) == (_memory_and_chunk(agent, a)[0], a.problem)
        assert _memory_and_chunk(agent, a)[1][-1] == agent.tokenizer.convert_tokens_to_ids(".")
        assert len(chunk) == size
        source = synthetic.filler_text(4 * size, 3, index).split()
        words = agent.tokenizer.convert_ids_to_tokens(chunk)
        (start,) = [i for i in range(len(source) - size + 1) if source[i:i + size] == words]
        starts.add(start)
        ends += words[-1] == "."
    assert ends <= 8 and len(starts) > 12  # a full stop ends a chunk about once in eight
    assert [t.turns[0].prompt_ids for t in
            filler_trajectories(agent, 24, seed=3, memory="held", cut=True)] == [
        t.turns[0].prompt_ids for t in cut]
    # learner.carry_cut reaches the rows a supervised step trains on
    learner = LearnerConfig(loss="sft", carry_rows=3, carry_pool=2, carry_cut=True)
    zeros = lambda rows: np.zeros(rows.tokens.shape, np.float32)  # noqa: E731 - all ties
    rows = warmup_trajectories(agent, learner, seed=3, logprobs=zeros)
    assert [t.turns[0].prompt_ids for t in rows] == [t.turns[0].prompt_ids for t in cut[:3]]


def test_blank_rows_keep_the_initial_memory_at_a_cut_chunk_without_a_fact(agent):
    # A long document's turns before its first fact: the memory is still the initial one, the
    # chunk is cut mid-text, and the reply must not make up a fact for the asked key.
    tokenizer, size = agent.tokenizer, agent.config.chunk_tokens
    learner = LearnerConfig(loss="sft", blank_rows=24)
    rows = warmup_trajectories(agent, learner, seed=3)
    held = filler_trajectories(agent, 24, seed=3, memory="held", cut=True)
    assert len(rows) == 24
    for index, (trajectory, carry) in enumerate(zip(rows, held)):
        (turn,) = trajectory.turns
        given, chunk = _memory_and_chunk(agent, trajectory)
        assert given == list(agent.prompts.initial_memory)
        assert turn.response_ids == [*given, tokenizer.eos_token_id]
        assert len(chunk) == size and not {"code", "city"} & set(tokenizer.decode(chunk).split())
        # the same question and chunk as the held carry of the same draw, its memory not read
        assert (chunk, trajectory.problem) == (_memory_and_chunk(agent, carry)[1], carry.problem)
    assert {"city" in t.problem for t in rows} == {False, True}
    with pytest.raises(ValueError, match="memory must be one of"):
        filler_trajectories(agent, 1, seed=3, memory="empty")
    with pytest.raises(ConfigError, match="learner.blank_rows"):
        LearnerConfig(blank_rows=4)  # a supervised warm-up's rows, not DAPO's


def test_fact_rows_from_a_pool_are_the_hardest_candidates(agent):
    candidates = fact_trajectories(agent, 12, seed=5)
    weak = {7: -9.0, 2: -4.0, 10: -6.0}  # the weakest reply token of these rows

    def logprobs(rows):  # every reply token -0.5, one token of the rows above lower
        assert len(rows) == 12
        out = np.zeros(rows.tokens.shape, np.float32)
        for i, (start, end) in enumerate(zip(rows.prompt_lengths, rows.lengths)):
            out[i, start:end] = -0.5
            out[i, end - 1] = weak.get(i, -0.5)
        return out

    learner = LearnerConfig(loss="sft", fact_rows=3, fact_pool=4)
    rows = warmup_trajectories(agent, learner, seed=5, logprobs=logprobs)
    assert [t.turns[0].prompt_ids for t in rows] == [
        candidates[i].turns[0].prompt_ids for i in (7, 10, 2)]
    plain = warmup_trajectories(agent, LearnerConfig(loss="sft", fact_rows=3), seed=5)
    assert [t.turns[0].prompt_ids for t in plain] == [
        t.turns[0].prompt_ids for t in candidates[:3]]  # without a pool: the first drawn
    with pytest.raises(ConfigError, match="learner.fact_pool"):
        LearnerConfig(loss="sft", fact_pool=4)


def test_own_fact_rows_bring_the_models_own_first_memory_to_the_facts_chunk(agent):
    tokenizer = agent.tokenizer
    read = []

    def made_up(sample):  # the model's first memory: a made-up value for the asked key
        return tokenizer(f"the code of {sample.problem.split()[-2]} tumoba .",
                         add_special_tokens=False)["input_ids"]

    def greedy(samples):
        read.extend(samples)
        return [[Trajectory(s.problem, [Turn("update", [], made_up(s) + [tokenizer.eos_token_id],
                                             [], "stop", "")])] for s in samples]

    learner = LearnerConfig(loss="sft", own_fact_rows=12)
    rows = warmup_trajectories(agent, learner, seed=5, greedy=greedy)
    assert len(rows) == len(read) == 12
    for trajectory, sample in zip(rows, read):
        (turn,) = trajectory.turns
        memory, chunk = _memory_and_chunk(agent, trajectory)
        # greedy read the row's question over one fact-free chunk from the initial memory
        assert sample.problem == trajectory.problem and sample.initial_memory is None
        assert sample.problem_ids == tuple(tokenizer(trajectory.problem,
                                                     add_special_tokens=False)["input_ids"])
        (filler,) = sample.chunks
        assert len(filler) == BUDGETS.chunk_tokens
        assert not {"code", "city"} & set(tokenizer.decode(filler).split())
        # the row: that memory at the chunk of the first fact, the reply the fact alone
        assert memory == made_up(sample)
        facts = _facts(tokenizer.decode(turn.response_ids[:-1]))
        assert facts and all(f[4] != "tumoba" and " ".join(f) in tokenizer.decode(chunk)
                             for f in facts)
        assert turn.response_ids[-1] == tokenizer.eos_token_id
    assert {"city" in t.problem for t in rows} == {False, True}
    with pytest.raises(ConfigError, match="learner.own_fact_rows"):
        LearnerConfig(own_fact_rows=4)


def test_carry_rows_are_the_candidates_whose_weakest_reply_token_is_least_likely(agent):
    pool = filler_trajectories(agent, 12, seed=5, memory="held")
    rows = rows_from_trajectories([[t] for t in pool], np.ones(len(pool)))
    seen = []

    def logprobs(given):  # each row's reply tokens: all -1.0, or all 0 but one at -weak
        assert [list(r) for r in given.tokens] == [list(r) for r in rows.tokens]
        seen.append(len(given))
        out = np.full(given.tokens.shape, -50.0, np.float32)  # prompt positions: ignored
        for i, (start, end) in enumerate(zip(given.prompt_lengths, given.lengths)):
            out[i, start:end] = -1.0 if i % 3 == 0 else 0.0
            if i % 3:
                out[i, start + i % (end - start)] = -0.5 * i
        return out

    chosen = carry_trajectories(agent, 4, 3, seed=5, logprobs=logprobs)
    assert seen == [12]
    # weakest tokens: -1 for rows 0, 3, 6, 9; -0.5 i for the others (-5.5 for 11 ...); a
    # mean over the reply would choose the rows all at -1, which no single token marks
    assert [t.turns[0].prompt_ids for t in chosen] == [
        pool[i].turns[0].prompt_ids for i in (11, 10, 8, 7)]
    assert {len(carry_trajectories(agent, 4, 3, seed=5, logprobs=logprobs))} == {4}


def _facts(text):
    """Fact sentences of a text as word lists: [["the", "code", "of", KEY, VALUE], ...]."""
    words = text.replace(".", " . ").split()
    return [words[i:i + 5] for i in range(len(words) - 4)
            if words[i] == "the" and words[i + 1] in ("code", "city") and words[i + 2] == "of"
            and words[i + 3] != "the"]


def test_fact_rows_write_the_chunks_fact_over_a_wrong_one_or_none(agent):
    tokenizer = agent.tokenizer
    rows = fact_trajectories(agent, 40, seed=3)
    # the documents `data synthetic --seed 3` writes (a step's seed is 3 here), without spaces
    seed_documents = ["".join(synthetic.make_sample(task, 1024, 3, i).context.split())
                      for task in synthetic.TASKS for i in range(60)]
    tasks, contradicted = set(), 0
    for trajectory in rows:
        (turn,) = trajectory.turns
        assert turn.kind == "update" and turn.response_ids[-1] == tokenizer.eos_token_id
        reply = _facts(tokenizer.decode(turn.response_ids[:-1]))
        # the prompt is the agent's update prompt around a memory and a chunk of C tokens
        memory_ids, chunk_ids = _memory_and_chunk(agent, trajectory)
        memory, chunk = (_facts(tokenizer.decode(ids)) for ids in (memory_ids, chunk_ids))
        # the reply takes facts of the chunk that the memory lacks, and keeps no fact that
        # they contradict (same subject, other object)
        new = [f for f in reply if f in chunk and f not in memory]
        assert new
        wrong = [m for m in memory if any(m[:4] == f[:4] and m[4] != f[4] for f in new)]
        assert not any(w in reply for w in wrong)
        contradicted += bool(wrong)
        if "city" not in trajectory.problem:  # multikey: the asked key's fact only
            tasks.add("multikey")
            assert reply == new and new[0][3] == trajectory.problem.split()[-2]
        else:
            tasks.add("twohop")
        text = "".join(tokenizer.decode(chunk_ids).split())
        assert not any(text in document for document in seed_documents)
    assert tasks == {"multikey", "twohop"} and contradicted == 20  # every other row
    again = fact_trajectories(agent, 40, seed=3)
    assert [t.turns[0].prompt_ids for t in again] == [t.turns[0].prompt_ids for t in rows]


@pytest.fixture(scope="module")
def recipe_data(tmp_path_factory):
    data = tmp_path_factory.mktemp("data")
    for task in synthetic.TASKS:
        assert main(["data", "synthetic", "--task", task, "--lengths", "200", "400",
                     "--num-samples", "8", "--layout", "train", "--out", str(data)]) == 0
    assert main(["data", "synthetic", "--task", "multikey", "--lengths", "1024",
                 "--num-samples", "4", "--seed", "2", "--out", str(data)]) == 0
    return data


@pytest.mark.slow
@pytest.mark.parametrize("name", ["synthetic_copy", "synthetic_sft", "synthetic_sft_far",
                                  "synthetic_sft_anywhere", "synthetic_sft_late",
                                  "synthetic_sft_carry", "synthetic_sft_carry_cut"])
def test_the_shipped_sft_configs_train_and_validate_through_the_memory_loop(
        recipe_data, name, tmp_path):
    """The recipe's supervised steps as shipped, for two steps each, on one CPU device as the
    recipe runs (a process of its own: this one has 8); steps 1-4 start from a random model
    of the recipe's shape in place of the previous step's checkpoint. (Copy, recall and fact
    rows are cut to 8 a step here, carry rows to 4 of 16, and one config validates: time.
    Step 4c's config runs as the base of step 4d's, whose own keys are its learning rate,
    carry rows and cut chunks: with carry rows cut to 4 of 16, 4c alone would run as 4b.)"""
    data, out = recipe_data, tmp_path / "run"
    path = os.path.join(ROOT, "configs", f"{name}.yaml")
    config = load_train_config(path)
    start = [] if config.model.preset else ["model.path=null", "model.preset=small"]
    copies, recalls, facts = (min(getattr(config.learner, f"{kind}_rows"), 8)
                              for kind in ("copy", "recall", "fact"))
    carries = min(config.learner.carry_rows, 4)
    validate = name == "synthetic_sft_anywhere"
    multiprocess.check_ok(multiprocess.run(
        ["train", "--config", path, *start, f"model.tokenizer={data}/tokenizer",
         f"data.train=[{data}/train_multikey.parquet, {data}/train_twohop.parquet]",
         f"data.val={data}/eval_multikey_1024.json", "validation.size=4",
         f"validation.every={2 if validate else 0}", f"learner.copy_rows={copies}",
         f"learner.recall_rows={recalls}", f"learner.fact_rows={facts}",
         f"learner.carry_rows={carries}", "learner.carry_pool=4", "steps=2",
         "prompts_per_step=2",
         f"output_dir={out}", "compilation_cache_dir=null"],
        num_processes=1, timeout_s=300, devices=1))
    with open(out / "logs" / "steps.jsonl") as f:
        records = [json.loads(line) for line in f]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["reward/mean"] == 1.0 for r in records)  # the oracle answers right
    # every oracle turn (2 or 3 a document), the config's copy, recall, fact and carry rows
    extra = copies + recalls + facts + carries
    assert extra and all(2 * 2 + extra <= r["learner/rows"] <= 2 * 3 + extra for r in records)
    assert all(np.isfinite(r["learner/loss"]) for r in records)
    assert records[0]["learner/lr"] == 0.0 < records[1]["learner/lr"]  # warm-up
    assert ("val/accuracy" in records[1]) == validate
    assert (out / "checkpoints" / "2").is_dir()
