"""One step's rollout batch (rl/collect.py) on a scripted agent: which groups DAPO's dynamic
sampling keeps and in what order, how it refills, and the overlong penalty of each turn
against its own cap, all against hand-computed values."""

import types

import numpy as np
import pytest

from memagent_jax.data.pipeline import Example
from memagent_jax.rl.collect import collect_batch, overlong_penalties
from memagent_jax.rollout.memagent import MemAgentConfig, Trajectory, Turn


def _turn(kind, reply, tokens):
    return Turn(kind, [1, 2, 3], list(range(4, 4 + tokens)), [-1.0] * tokens, "stop", reply)


class ScriptedAgent:
    """`MemoryAgent`'s interface (read, run) replaying scripted replies: question q's j-th
    trajectory answers script[q][j] (a word; "-" is no answer) after one update turn of
    `update_tokens[q]` tokens, with a final reply of `final_tokens[q]` tokens."""

    def __init__(self, script, update_tokens=None, final_tokens=None):
        self.script, self.runs = script, []
        self.update_tokens, self.final_tokens = update_tokens or {}, final_tokens or {}

    def read(self, question, context, strict=True):
        assert not strict  # training carries on past an over-long question or empty document
        return question

    def run(self, params, samples, sampling, n=1, on_turn=None):
        self.runs.append((list(samples), sampling.seed))
        groups = []
        for q in samples:
            answers = self.script[q]
            assert len(answers) == n
            groups.append([Trajectory(q, [
                _turn("update", "memory", self.update_tokens.get(q, 3)),
                _turn("final", "no answer" if a == "-" else f"\\boxed{{{a}}}",
                      self.final_tokens.get(q, 2))], None if a == "-" else a)
                for a in answers])
        return groups


def _examples(questions):
    return iter([Example(i, "hotpotqa", q, "a document", ("paris",))
                 for i, q in enumerate(questions)])


def _config(prompts, dynamic, max_tries=3, overlong=False, memory_cap=8, final_cap=4,
            buffer=2):
    return types.SimpleNamespace(
        rollout=types.SimpleNamespace(n=2, temperature=1.0, top_p=1.0, top_k=0),
        memagent=MemAgentConfig(max_memory_tokens=memory_cap, max_final_tokens=final_cap),
        prompts_per_step=prompts,
        dynamic_sampling=types.SimpleNamespace(enabled=dynamic, max_tries=max_tries),
        overlong=types.SimpleNamespace(enabled=overlong, buffer=buffer, penalty_factor=1.0),
        data=types.SimpleNamespace(reward="by_source"))


SCRIPT = {"q0": ["paris", "paris"],   # all right: no advantage anywhere
          "q1": ["paris", "rome"],    # mixed: informative
          "q2": ["-", "-"],           # all wrong
          "q3": ["rome", "paris"],    # mixed
          "q4": ["paris", "-"],       # mixed
          "q5": ["rome", "rome"]}     # all wrong


def test_dynamic_sampling_keeps_only_groups_with_different_rewards_and_refills():
    """2 groups wanted: round 1 draws q0 q1 (keeps q1), round 2 draws one more, q2 (keeps
    nothing), round 3 draws q3 (keeps it). Seeds come from seed_for_try per round."""
    agent = ScriptedAgent(SCRIPT)
    batch = collect_batch(agent, None, _examples(list(SCRIPT)), _config(2, dynamic=True),
                          seed_for_try=lambda k: 100 + k)
    assert [e.question for e in batch.examples] == ["q1", "q3"]
    np.testing.assert_array_equal(batch.rewards, [[1, 0], [0, 1]])
    assert batch.drawn == [0, 1, 2, 3] and batch.tries == 3
    assert [samples for samples, _ in agent.runs] == [["q0", "q1"], ["q2"], ["q3"]]
    assert [seed for _, seed in agent.runs] == [100, 101, 102]
    assert batch.stats["dynamic/kept_fraction"] == pytest.approx(2 / 4)
    assert batch.stats["reward/mean"] == pytest.approx(np.mean([1, 1, 1, 0, 0, 0, 0, 1]))
    assert batch.stats["rollout/answered_fraction"] == pytest.approx(6 / 8)


def test_dynamic_sampling_stops_after_max_tries_with_what_it_kept():
    agent = ScriptedAgent(SCRIPT)
    batch = collect_batch(agent, None, _examples(["q0", "q2", "q5", "q0"]),
                          _config(2, dynamic=True, max_tries=2), seed_for_try=lambda k: k)
    assert batch.examples == [] and batch.rewards.shape == (0, 2)
    assert batch.drawn == [0, 1, 2, 3] and batch.tries == 2


def test_without_dynamic_sampling_every_group_is_kept_in_one_round():
    agent = ScriptedAgent(SCRIPT)
    batch = collect_batch(agent, None, _examples(list(SCRIPT)), _config(3, dynamic=False),
                          seed_for_try=lambda k: k)
    assert [e.question for e in batch.examples] == ["q0", "q1", "q2"]
    np.testing.assert_array_equal(batch.rewards, [[1, 1], [1, 0], [0, 0]])
    assert batch.tries == 1 and batch.stats["dynamic/kept_fraction"] == 1.0


def test_overlong_penalty_judges_each_turn_against_its_own_cap():
    """Caps: memory 8, final 4, buffer 2 (penalty -(L - (cap - 2)) / 2, floored at -1).
    q1's update reply (7 tokens) is over the final cap but under the memory cap: -0.5 from it;
    q3's final reply (4 tokens) is at the final cap: -1, its update (3) costs nothing."""
    agent = ScriptedAgent(SCRIPT, update_tokens={"q1": 7, "q3": 3},
                          final_tokens={"q1": 2, "q3": 4})
    groups = agent.run(None, ["q1", "q3"], types.SimpleNamespace(seed=0), n=2)
    np.testing.assert_allclose(overlong_penalties(groups, 8, 4, 2, 1.0),
                               [[-0.5, -0.5], [-1.0, -1.0]])
    batch = collect_batch(ScriptedAgent(SCRIPT, {"q1": 7, "q3": 3}, {"q1": 2, "q3": 4}),
                          None, _examples(["q1", "q3"]),
                          _config(2, dynamic=False, overlong=True), seed_for_try=lambda k: k)
    np.testing.assert_allclose(batch.rewards, [[0.5, -0.5], [-1.0, 0.0]])
    assert batch.stats["reward/mean"] == pytest.approx(0.5)  # the verifier's, unshaped
