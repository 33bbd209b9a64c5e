"""Format-only trajectories (synthetic/format_rows.py, `plugin.target: format`): the agent's
loop with memories of sentences drawn regardless of what they say, and a final turn that
answers from a memory holding the answer."""

import numpy as np
import pytest

from memagent_jax.data.pipeline import Example
from memagent_jax.rl.rewards import strict_reward
from memagent_jax.synthetic import tasks as synthetic
from memagent_jax.synthetic.format_rows import format_trajectory, whole_sentences
from memagent_jax.synthetic.oracle import oracle_trajectory
from memagent_jax.synthetic.plugin import SyntheticPlugin, PluginSection
from tests.builders import SFT_BUDGETS, sft_agent


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    return sft_agent(tmp_path_factory)


def _example(task, length, index, seed=3):
    row = synthetic.train_row(synthetic.make_sample(task, length, seed, index), task, length,
                              index)
    return Example(index, row["data_source"], row["prompt"][0]["content"], row["context"],
                   tuple(row["reward_model"]["ground_truth"]), row["extra_info"])


def _lines(text):
    """A memory's sentences, single-spaced, the stop apart ("a b." -> "a b .")."""
    return [" ".join(s.replace(".", " .").split()) + " ." for s in text.split(".") if s.strip()]


@pytest.mark.parametrize("task", synthetic.TASKS)
def test_a_format_trajectory_is_the_agents_loop_with_drawn_memories(agent, task):
    example = _example(task, 200, 1)
    trajectory = format_trajectory(agent, example)
    sample = agent.read(example.question, example.context, strict=False)
    tokenizer, prompts, eos = agent.tokenizer, agent.prompts, agent.tokenizer.eos_token_id
    assert [t.kind for t in trajectory.turns] == ["update"] * len(sample.chunks) + ["final"]
    memory, previous_lines, read = prompts.initial_memory, [], ""
    for turn, chunk in zip(trajectory.turns, sample.chunks):
        assert turn.prompt_ids == prompts.update(sample.problem_ids, memory, chunk)
        assert turn.response_ids[-1] == eos and eos not in turn.response_ids[:-1]
        assert len(turn.response_ids) <= SFT_BUDGETS.max_memory_tokens
        read += " " + tokenizer.decode(chunk)
        lines = _lines(turn.reply)
        # Whole sentences of the previous memory or the chunk, in reading order.
        allowed = previous_lines + _lines(read)
        assert lines and all(line in allowed for line in lines)
        assert [allowed.index(line) for line in lines] == sorted(allowed.index(line)
                                                                   for line in lines)
        memory, previous_lines = turn.response_ids[:-1], lines
    final = trajectory.turns[-1]
    assert strict_reward(final.reply, list(example.ground_truths)) == 1.0
    needed = [f["text"] for f in example.extra_info["facts"] if f["needed"]]
    shown = tokenizer.decode(final.prompt_ids)
    assert all(" ".join(_lines(fact)[0].split()) in " ".join(_lines(shown.replace("\n", " ")))
               for fact in needed)
    # Drawn from the row alone: the same again, another row another draw.
    again = format_trajectory(agent, example)
    assert [t.response_ids for t in again.turns] == [t.response_ids for t in trajectory.turns]
    other = format_trajectory(agent, _example(task, 200, 1, seed=4))
    assert [t.response_ids for t in other.turns] != [t.response_ids for t in trajectory.turns]


def test_a_fact_is_kept_as_often_as_any_sentence(agent):
    """Over one-chunk documents, the first memory keeps the asked fact, the other facts and
    the filler at one rate: nothing in these rows says which words to keep. The oracle's keep
    the asked fact always and nothing else."""
    def rates(make):
        kept = {"asked": [], "other": [], "filler": []}
        for index in range(300):
            example = _example("multikey", 60, index)
            (update, _) = make(agent, example).turns
            memory = _lines(update.reply)
            for sentence in _lines(example.context):
                fact = next((f for f in example.extra_info["facts"]
                             if _lines(f["text"])[0] == sentence), None)
                kind = "filler" if fact is None else "asked" if fact["needed"] else "other"
                kept[kind].append(sentence in memory)
        return {kind: float(np.mean(v)) for kind, v in kept.items()}

    drawn = rates(format_trajectory)
    assert 0.3 < drawn["filler"] < 0.8
    assert abs(drawn["asked"] - drawn["filler"]) < 0.12
    assert abs(drawn["other"] - drawn["filler"]) < 0.12
    oracle = rates(oracle_trajectory)
    assert oracle["asked"] == 1.0 and oracle["other"] == oracle["filler"] == 0.0


def test_whole_sentences_drop_a_cut_sentences_pieces():
    assert whole_sentences("of a b. the c d. a e", opens=False) == ["the c d."]
    assert whole_sentences("the x y . a c d. a e", opens=True) == ["the x y .", "a c d."]


def test_the_plugin_trains_on_the_target_the_section_names(agent):
    example = _example("multikey", 200, 2)
    replies = lambda t: [turn.response_ids for turn in t.turns]  # noqa: E731
    assert replies(SyntheticPlugin(PluginSection(target="format")).target(agent, example)) == \
        replies(format_trajectory(agent, example))
    assert replies(SyntheticPlugin(PluginSection()).target(agent, example)) == \
        replies(oracle_trajectory(agent, example))
