"""The supervised warm-up's other rows (synthetic/rows.py, synthetic/plugin.py): copy,
recall, carry and fact rows."""

import numpy as np
import pytest

from memagent_jax.rl.plugin import StepContext
from memagent_jax.rl.rows import rows_from_trajectories
from memagent_jax.synthetic import tasks as synthetic
from memagent_jax.synthetic.plugin import PluginSection, SyntheticPlugin
from memagent_jax.synthetic.rows import (
    carry_candidates,
    carry_trajectories,
    copy_trajectories,
    fact_trajectories,
    recall_trajectories,
)
from memagent_jax.tokenizer import word_ids
from tests.builders import SFT_BUDGETS


def test_copy_rows_repeat_a_seeded_span_of_task_words(agent):
    tokenizer = agent.tokenizer
    first = copy_trajectories(tokenizer, 3, 5, seed=1, min_span=5)
    words = set(word_ids(tokenizer, synthetic.words().all()))
    for trajectory in first:
        (turn,) = trajectory.turns
        assert len(turn.prompt_ids) == 5 and set(turn.prompt_ids) <= words
        assert turn.response_ids == [*turn.prompt_ids, tokenizer.eos_token_id]
        assert len(turn.response_logprobs) == 6
    prompts = lambda ts: [t.turns[0].prompt_ids for t in ts]
    assert prompts(copy_trajectories(tokenizer, 3, 5, seed=1, min_span=5)) == prompts(first)
    assert prompts(copy_trajectories(tokenizer, 3, 5, seed=2, min_span=5)) != prompts(first)


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
        facts = lambda ids: [f.strip() for f in tokenizer.decode(ids).split(".")]
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
    memory = turn.prompt_ids[at:at + len(turn.prompt_ids) - len(empty) - SFT_BUDGETS.chunk_tokens]
    without = prompts.update(problem, memory, [])
    at = next(i for i, (a, b) in enumerate(zip(turn.prompt_ids, without)) if a != b)
    chunk = turn.prompt_ids[at:at + SFT_BUDGETS.chunk_tokens]
    assert prompts.update(problem, memory, chunk) == turn.prompt_ids
    return memory, chunk


def test_carry_candidates_hold_the_facts_the_question_needs(agent):
    tokenizer = agent.tokenizer
    rows = carry_candidates(agent, 24, seed=3)
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
    whole = carry_candidates(agent, 24, seed=3)
    cut = carry_candidates(agent, 24, seed=3, cut=True)
    ends, starts = 0, set()
    for index, (a, b) in enumerate(zip(whole, cut)):
        memory, chunk = _memory_and_chunk(agent, b)
        assert (memory, b.problem) == (_memory_and_chunk(agent, a)[0], a.problem)
        assert _memory_and_chunk(agent, a)[1][-1] == word_ids(agent.tokenizer, ["."])[0]
        assert len(chunk) == size
        source = synthetic.filler_text(4 * size, 3, index).split()
        words = agent.tokenizer.decode(chunk).replace(".", " .").split()
        (start,) = [i for i in range(len(source) - size + 1) if source[i:i + size] == words]
        starts.add(start)
        ends += words[-1] == "."
    assert ends <= 8 and len(starts) > 12  # a full stop ends a chunk about once in eight
    assert [t.turns[0].prompt_ids for t in
            carry_candidates(agent, 24, seed=3, cut=True)] == [
        t.turns[0].prompt_ids for t in cut]
    # plugin.carry_cut reaches the rows a supervised step trains on
    plugin = SyntheticPlugin(PluginSection(carry_rows=3, carry_pool=2, carry_cut=True))
    zeros = lambda rows: np.zeros(rows.tokens.shape, np.float32)  # all ties
    rows = plugin.extra_trajectories(StepContext(agent, 3, zeros, rollouts=None))
    assert [t.turns[0].prompt_ids for t in rows] == [t.turns[0].prompt_ids for t in cut[:3]]


def test_carry_rows_are_the_candidates_whose_weakest_reply_token_is_least_likely(agent):
    pool = carry_candidates(agent, 12, seed=5)
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
