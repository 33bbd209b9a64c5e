"""The synthetic plugin's validation metrics (`SyntheticPlugin.validation_metrics`): the
per-turn rate at which memories lose a needed fact, over memories written here by hand and
counted by hand; and `tasks.sample_of`, which finds a document's facts in its text."""

import dataclasses

import pytest

from memagent_jax.agents.memagent.agent import MemAgent
from memagent_jax.agents.memagent.config import MemAgentConfig
from memagent_jax.data.needle import write_tokenizer
from memagent_jax.data.pipeline import Example
from memagent_jax.rollout.agent_api import Trajectory, Turn
from memagent_jax.synthetic import tasks as synthetic
from memagent_jax.synthetic.plugin import PluginSection, SyntheticPlugin
from memagent_jax.tokenizer import load_tokenizer

BUDGETS = MemAgentConfig(chunk_tokens=64, max_memory_tokens=40, max_final_tokens=8,
                         max_problem_tokens=16)


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    """A MemAgent on the synthetic tasks' tokenizer: chunks of 64 (no model: the metrics read
    its tokenizer and budgets only)."""
    path = write_tokenizer(str(tmp_path_factory.mktemp("tok")), synthetic.vocabulary())
    tokenizer = load_tokenizer(path)
    return MemAgent(BUDGETS, tokenizer, (tokenizer.eos_token_id,))


@pytest.mark.parametrize("task", synthetic.TASKS)
def test_a_documents_facts_are_found_in_its_text_as_it_was_made(task):
    for length in (200, 1000):
        for index in range(50):
            made = synthetic.make_sample(task, length, 3, index)
            assert synthetic.sample_of(made.question, made.context, made.answer) == made


def _first_chunk_documents(length):
    """multikey documents of seed 1 whose needed fact lies whole in the first chunk."""
    for index in range(200):
        document = synthetic.make_sample("multikey", length, 1, index)
        fact = next(f.text for f in document.facts if f.needed)
        if document.context.split().index(fact.split()[3]) + 2 < BUDGETS.chunk_tokens:
            yield index, document, fact


def _trajectory(memories):
    turns = [Turn("update", [1], [2], [0.0], "stop", m, {"memory": m}) for m in memories]
    return Trajectory("q", turns + [Turn("final", [1], [2], [0.0], "stop", "x")], "x")


def _example(index, document):
    return Example(index, "synthetic_multikey", document.question, document.context,
                   (document.answer,))


def test_validation_counts_every_turn_a_held_needed_fact_is_lost(agent):
    documents = _first_chunk_documents(256)  # 4 chunks: the fact due after the first
    (a, doc_a, fact_a), (b, doc_b, fact_b) = next(documents), next(documents)
    twohop = synthetic.make_sample("twohop", 256, 1, 0)   # two needed facts, one a half
    lives, code = (f.text for f in twohop.facts if f.needed)
    groups = [[_trajectory([fact_a, "", fact_a, fact_a])],     # held 0, 2: lost once, at 1
              [_trajectory([fact_b] * 4),                      # held throughout: 3, none lost
               _trajectory([fact_b, fact_b]),                  # an exit after chunk 2: 1 taken
               _trajectory([""] * 4)],                         # never held: nothing carried
              [_trajectory([f"{lives}\n{code}"] * 4)]]         # both facts from the last one
    plugin = SyntheticPlugin(PluginSection())
    examples = [_example(a, doc_a), _example(b, doc_b), _example(2, twohop)]
    words = twohop.context.split()
    starts = [next(i for i in range(len(words)) if words[i:i + 6] == f.split())
              for f in (lives, code)]
    dues = [(start + 5) // 64 for start in starts]  # the chunk of its last word: read by then
    carried = 2 + 3 + 1 + sum(3 - due for due in dues)
    metrics = plugin.validation_metrics(agent, examples, groups)
    assert metrics == {"fact_carried_turns": carried, "fact_loss_rate": 1 / carried}


def test_one_chunk_documents_carry_nothing_and_a_fact_left_unread_is_left_out(agent):
    plugin = SyntheticPlugin(PluginSection())
    index, document, fact = next(_first_chunk_documents(64))
    assert plugin.validation_metrics(agent, [_example(index, document)],
                                     [[_trajectory([fact])]]) == {}
    # 2 chunks of a 16-chunk document: its first and last; a needed fact in the middle unread
    cut = MemAgent(dataclasses.replace(BUDGETS, max_chunks=2), agent.tokenizer,
                   agent.stop_ids)
    plugin = SyntheticPlugin(PluginSection())
    index, document = next(
        (i, d) for i in range(100) for d in [synthetic.make_sample("multikey", 1024, 1, i)]
        if 128 < d.context.split().index(next(f for f in d.facts if f.needed).text.split()[3])
        < 1024 - 128)
    fact = next(f.text for f in document.facts if f.needed)
    assert plugin.validation_metrics(cut, [_example(index, document)],
                                     [[_trajectory([fact, fact])]]) == {}


def test_each_read_is_traced_against_its_own_chunks_whatever_the_plugin_read_before(agent):
    """One plugin (a run's: it keeps the chunks each validation read makes) given two
    documents under one index (validation files each count their rows from 0), then the
    second read by an agent of 128-word chunks: each is traced against the chunks its own
    agent makes of its own document."""
    def fact_in_chunk(document, chunk):  # the needed fact's words all in chunk `chunk` of 64
        fact = next(f.text.split() for f in document.facts if f.needed)
        words = document.context.split()
        start = next(i for i in range(len(words)) if words[i:i + len(fact)] == fact)
        return start // 64 == chunk == (start + len(fact) - 1) // 64

    documents = [(d, next(f.text for f in d.facts if f.needed)) for i in range(200)
                 for d in [synthetic.make_sample("multikey", 256, 1, i)]]
    doc_a, fact_a = next((d, f) for d, f in documents if fact_in_chunk(d, 0))
    doc_b, fact_b = next((d, f) for d, f in documents if fact_in_chunk(d, 1))
    wide = MemAgent(dataclasses.replace(BUDGETS, chunk_tokens=128), agent.tokenizer,
                    agent.stop_ids)
    reads = [  # (agent, document, memories, the metrics counted by hand)
        # due after chunk 1 of 4; held then, lost at 2, held again at 3
        (agent, doc_a, [fact_a, "", fact_a, fact_a], {"fact_carried_turns": 2,
                                                      "fact_loss_rate": 0.5}),
        # due after chunk 2 of 4 (words 64-127); held from then on: 2 turns carried
        (agent, doc_b, ["", fact_b, fact_b, fact_b], {"fact_carried_turns": 2,
                                                      "fact_loss_rate": 0.0}),
        # due after chunk 1 of 2 (words 0-127); lost at 2
        (wide, doc_b, [fact_b, ""], {"fact_carried_turns": 1, "fact_loss_rate": 1.0})]
    plugin = SyntheticPlugin(PluginSection())
    for reader, document, memories, expected in reads:
        assert plugin.validation_metrics(reader, [_example(0, document)],
                                         [[_trajectory(memories)]]) == expected
