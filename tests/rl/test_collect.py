"""One step's rollout batch (rl/collect.py) on a scripted runner: which groups DAPO's dynamic
sampling keeps and in what order, how it refills, the examples it draws, its statistics, and
the overlong penalty of each turn against its own cap, all against hand-computed values.

The config is a real TrainConfig with every key these tests rely on set explicitly (the
defaults of dynamic sampling and overlong shaping are not what is tested here)."""

import numpy as np
import pytest

from memagent_jax.data.pipeline import Example
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.rl import collect
from memagent_jax.rl.collect import overlong_penalties
from memagent_jax.rl.config import load_train_config
from memagent_jax.rl.scoring import Rewarder
from memagent_jax.rollout.agent_api import Trajectory, Turn

# Question -> its group's n = 2 final answers ("-": no answer). The gold answer is "paris" and
# the verifier the strict HotpotQA one: a trajectory scores 1 when it answers \boxed{paris}.
SCRIPT = {"q0": ["paris", "paris"],   # all right: no advantage anywhere
          "q1": ["paris", "rome"],    # mixed: informative
          "q2": ["-", "-"],           # all wrong
          "q3": ["rome", "paris"],    # mixed
          "q4": ["paris", "-"],       # mixed
          "q5": ["rome", "rome"],     # all wrong
          "q6": ["paris", "!"]}       # "!": past its deadline (rollout.timeout_s)
UPDATE_TOKENS, FINAL_TOKENS = 3, 2  # reply lengths unless a test says otherwise


def _turn(kind, reply, tokens, cap):
    return Turn(kind, [1, 2, 3], list(range(4, 4 + tokens)), [-1.0] * tokens, "stop", reply,
                caps=(cap,))


class ScriptedRunner:
    """`AgentRunner`'s interface (with_params, with_limits, run) replaying SCRIPT: each
    trajectory is one memory update (asked with the memory cap) then the final answer (the
    final cap); lengths[q][j] = (update tokens, final tokens) of question q's j-th
    trajectory. Records each run's questions and sampling seed. Rows are drawn Examples or a
    start's question."""

    def __init__(self, lengths=None, memory_cap=8, final_cap=4):
        self.lengths, self.runs = lengths or {}, []
        self.caps = memory_cap, final_cap

    def with_params(self, params, fixed_sampling=False):
        return self

    def with_limits(self, limits):
        self.limits = limits
        return self

    def run(self, agent, rows, sampling, n=1, on_call=None, on_done=None):
        samples = [getattr(row, "question", row) for row in rows]
        self.runs.append((samples, sampling.seed))
        groups = []
        for q in samples:
            assert len(SCRIPT[q]) == n
            lengths = self.lengths.get(q, [(UPDATE_TOKENS, FINAL_TOKENS)] * n)
            groups.append([Trajectory(q, timed_out=True) if a == "!" else Trajectory(q, [
                _turn("update", "memory", update, self.caps[0]),
                _turn("final", "no answer" if a == "-" else f"\\boxed{{{a}}}", final,
                      self.caps[1])],
                None if a == "-" else a) for a, (update, final) in zip(SCRIPT[q], lengths)])
        return groups


def collect_batch(runner, iterator, config, seed_for_try, starts=None):
    return collect.collect_batch(runner, None, None, iterator, config, Rewarder(config.reward),
                                 seed_for_try, starts=starts)


def _examples(questions):
    """The data iterator: Example i asks questions[i]."""
    return iter([Example(i, "hotpotqa", q, "a document", ("paris",))
                 for i, q in enumerate(questions)])


def _config(prompts, dynamic, max_tries=3, overlong=False, memory_cap=8, final_cap=4):
    return load_train_config(None, [
        "data.train=[unread.parquet]", "model.path=unread", "reward.function=by_source",
        "rollout.n=2", f"prompts_per_step={prompts}",
        f"dynamic_sampling.enabled={str(dynamic).lower()}",
        f"dynamic_sampling.max_tries={max_tries}",
        f"overlong.enabled={str(overlong).lower()}", "overlong.buffer=2",
        "overlong.penalty_factor=1.0",
        f"memagent.max_memory_tokens={memory_cap}", f"memagent.max_final_tokens={final_cap}"])


def test_dynamic_sampling_keeps_groups_with_different_rewards_in_order_and_refills():
    """2 groups wanted: round 1 draws q0 q1 (keeps q1), round 2 draws the one still missing,
    q2 (keeps nothing), round 3 draws q3 (keeps it), seeded by seed_for_try(round)."""
    agent = ScriptedRunner()
    batch = collect_batch(agent, _examples(list(SCRIPT)), _config(2, dynamic=True),
                          seed_for_try=lambda k: 100 + k)
    assert [e.question for e in batch.examples] == ["q1", "q3"]
    assert [[t.answer for t in group] for group in batch.groups] == [["paris", "rome"],
                                                                     ["rome", "paris"]]
    np.testing.assert_array_equal(batch.rewards, [[1, 0], [0, 1]])
    assert batch.drawn == [0, 1, 2, 3] and batch.tries == 3
    assert agent.runs == [(["q0", "q1"], 100), (["q2"], 101), (["q3"], 102)]


def test_statistics_cover_every_sampled_trajectory_not_only_the_kept_ones():
    """The run above sampled 8 trajectories (q0 q1 q2 q3): rewards 1 1 | 1 0 | 0 0 | 0 1, each
    an update of 3 tokens and a final answer of 2, 6 of them answered; 2 of 4 groups kept."""
    batch = collect_batch(ScriptedRunner(), _examples(list(SCRIPT)),
                          _config(2, dynamic=True), seed_for_try=lambda k: k)
    stats = batch.stats
    assert stats["reward/mean"] == stats["reward/shaped_mean"] == pytest.approx(0.5)
    assert stats["reward/std"] == pytest.approx(0.5)
    assert stats["rollout/trajectories"] == 8 and stats["rollout/turns"] == 2
    assert stats["rollout/generated_tokens"] == 8 * (3 + 2)
    assert (stats["rollout/memory_length"], stats["rollout/final_length"]) == (3, 2)
    assert stats["rollout/response_length"] == pytest.approx(2.5)
    assert stats["rollout/answered_fraction"] == pytest.approx(6 / 8)
    assert stats["rollout/truncated_fraction"] == 0
    assert stats["dynamic/kept_fraction"] == pytest.approx(2 / 4)
    assert (stats["dynamic/kept_groups"], stats["dynamic/tries"]) == (2, 3)


def test_rollouts_past_their_deadline_are_counted_unscored_and_run_under_the_limits():
    """q6's second rollout timed out: no reward (NaN, out of the means and of dynamic
    sampling's judgement: q6 is all right), counted in rollout/timed_out."""
    runner = ScriptedRunner()
    config = load_train_config(None, ["data.train=[unread.parquet]", "model.path=unread",
                                      "reward.function=by_source", "rollout.n=2",
                                      "prompts_per_step=2", "rollout.timeout_s=2.5",
                                      "rollout.max_concurrent=3",
                                      "dynamic_sampling.enabled=true"])
    batch = collect_batch(runner, _examples(["q6", "q1", "q3"]), config,
                          seed_for_try=lambda k: k)
    assert (runner.limits.timeout_s, runner.limits.max_concurrent) == (2.5, 3)
    assert [e.question for e in batch.examples] == ["q1", "q3"]  # q6's one reward: no signal
    assert batch.stats["rollout/timed_out"] == 1
    assert batch.stats["reward/mean"] == pytest.approx(3 / 5)


def test_an_agent_without_memory_updates_logs_no_memory_length():
    """Memory length is MemAgent's (its update turns'): the statistics of a single-turn
    agent's rollouts, and so its steps.jsonl, have none."""
    groups = [[Trajectory("q", [_turn("final", "\\boxed{paris}", 4, 8)], "paris")] * 2]
    stats = collect.rollout_stats(groups, np.ones(2), np.ones(2))
    assert stats["rollout/final_length"] == 4 and stats["rollout/turns"] == 1
    assert "rollout/memory_length" not in stats


def test_dynamic_sampling_stops_after_max_tries_with_what_it_kept():
    """Nothing informative in 2 rounds of 2 prompts: an empty batch, and q1 (informative) is
    never drawn, because a third round is not run."""
    agent = ScriptedRunner()
    batch = collect_batch(agent, _examples(["q0", "q2", "q5", "q0", "q1", "q1"]),
                          _config(2, dynamic=True, max_tries=2), seed_for_try=lambda k: k)
    assert batch.examples == [] and batch.groups == [] and batch.rewards.shape == (0, 2)
    assert batch.drawn == [0, 1, 2, 3] and batch.tries == 2 and len(agent.runs) == 2
    assert batch.stats["dynamic/kept_fraction"] == 0


def test_without_dynamic_sampling_every_group_is_kept_in_one_round():
    """All-equal groups (q0 all right, q2 all wrong) are trained on too; no second round."""
    agent = ScriptedRunner()
    batch = collect_batch(agent, _examples(list(SCRIPT)),
                          _config(3, dynamic=False, max_tries=3), seed_for_try=lambda k: 7 + k)
    assert [e.question for e in batch.examples] == ["q0", "q1", "q2"]
    np.testing.assert_array_equal(batch.rewards, [[1, 1], [1, 0], [0, 0]])
    assert batch.drawn == [0, 1, 2] and batch.tries == 1
    assert agent.runs == [(["q0", "q1", "q2"], 7)]
    assert batch.stats["dynamic/kept_fraction"] == 1.0


def test_carry_starts_take_the_place_of_drawn_prompts_in_the_first_round_only(monkeypatch):
    """2 groups wanted and one prompt of the step's own (a carry start asking q3, an
    informative group): round 1 runs it with one drawn prompt, q0 (dropped); round 2 draws
    the one still missing, q1, and calls for no more starts. On a clock that each round's
    rollouts move 1 s, making the starts took 5 s: time/starts_s, left out of time/rollout_s
    (rollout/tokens_per_s counts no token of theirs)."""
    agent, calls, clock = ScriptedRunner(), [], [100.0]
    monkeypatch.setattr(collect.time, "perf_counter", lambda: clock[0])
    run = agent.run

    def timed_run(*args, **kwargs):
        clock[0] += 1.0
        return run(*args, **kwargs)

    agent.run = timed_run

    def starts():
        calls.append(1)
        clock[0] += 5.0
        return [Example(-1, "hotpotqa", "q3", "", ("paris",))], ["q3"]

    batch = collect_batch(agent, _examples(list(SCRIPT)), _config(2, dynamic=True),
                          seed_for_try=lambda k: 100 + k, starts=starts)
    assert (batch.stats["time/starts_s"], batch.stats["time/rollout_s"]) == (5.0, 2.0)
    assert agent.runs == [(["q0", "q3"], 100), (["q1"], 101)] and calls == [1]
    assert [e.index for e in batch.examples] == [-1, 1] and batch.drawn == [0, 1]
    np.testing.assert_array_equal(batch.rewards, [[0, 1], [1, 0]])
    assert batch.stats["reward/starts_mean"] == 0.5  # q3's alone
    monkeypatch.undo()  # the clock runs again
    plain = collect_batch(ScriptedRunner(), _examples(list(SCRIPT)),
                          _config(2, dynamic=True), seed_for_try=lambda k: k)
    assert "reward/starts_mean" not in plain.stats and "time/starts_s" not in plain.stats


def test_dynamic_sampling_judges_the_shaped_rewards():
    """q0's answers are both right, but its second final answer is at the final cap (4 tokens,
    penalty -1): shaped rewards 1, 0 differ, so the group is kept (docs/algorithm.md: the
    penalty is added before dynamic sampling); q5 (both wrong, no penalty) is dropped."""
    agent = ScriptedRunner({"q0": [(3, 2), (3, 4)]})
    batch = collect_batch(agent, _examples(["q5", "q0"]),
                          _config(1, dynamic=True, overlong=True), seed_for_try=lambda k: k)
    assert [e.question for e in batch.examples] == ["q0"]
    np.testing.assert_array_equal(batch.rewards, [[1, 0]])


# The overlong penalty with buffer 2: -(L - (cap - 2)) / 2, clipped to [-1, 0]. Each case:
# (memory cap, final cap, q1's and q3's (update, final) reply lengths, their penalties).
# Each trajectory takes the worst of its turns; with the two caps swapped, every penalty
# below would differ.
OVERLONG_CASES = {
    # q1: update 7 of memory cap 8: -0.5 (against the final cap 4 it would be -1).
    # q3: final 4 at final cap 4: -1 (against 8: 0); its update of 3 (against 4: -0.5): 0.
    "memory_cap_above_final_cap": (8, 4, (7, 2), (3, 4), [-0.5, -1.0]),
    # q1: update 5, over memory cap 4 but under final cap 8: -1 (against 8: 0).
    # q3: final 7 of final cap 8: -0.5 (against 4: -1).
    "memory_cap_below_final_cap": (4, 8, (5, 2), (1, 7), [-1.0, -0.5]),
}


@pytest.mark.parametrize("case", list(OVERLONG_CASES))
def test_overlong_penalty_judges_each_turn_against_its_own_cap(case):
    memory_cap, final_cap, q1, q3, expected = OVERLONG_CASES[case]
    groups = ScriptedRunner({"q1": [q1, q1], "q3": [q3, q3]}, memory_cap, final_cap).run(
        None, ["q1", "q3"], SamplingParams(seed=0), n=2)
    np.testing.assert_array_equal(overlong_penalties(groups, 2, 1.0),
                                  [[expected[0]] * 2, [expected[1]] * 2])


def test_a_reply_whose_cap_is_below_the_buffer_slopes_over_its_whole_cap():
    """overlong.buffer 8 over replies capped at 16 and 4 (the config bounds the buffer by
    MemAgent's caps only: another agent's replies may ask for fewer tokens, a tool agent's
    max_tokens of 64 under the default buffer of 256). The reply capped at 4 slopes over its
    whole cap, -L / 4. q1: 14 of 16 (-(14 - 8) / 8 = -0.75), 1 of 4 (-0.25): -0.75. q3: 3
    of 16 (0), 2 of 4 (-0.5): -0.5."""
    groups = ScriptedRunner({"q1": [(14, 1)] * 2, "q3": [(3, 2)] * 2}, 16, 4).run(
        None, ["q1", "q3"], SamplingParams(seed=0), n=2)
    np.testing.assert_array_equal(overlong_penalties(groups, 8, 1.0),
                                  [[-0.75, -0.75], [-0.5, -0.5]])


@pytest.mark.parametrize("case", list(OVERLONG_CASES))
def test_collected_rewards_are_the_verifiers_plus_each_turns_overlong_penalty(case):
    """q1 scores [1, 0], q3 [0, 1]; the penalties above are added (memagent.max_memory_tokens,
    max_final_tokens, overlong.buffer 2); reward/mean stays the verifier's."""
    memory_cap, final_cap, q1, q3, (p1, p3) = OVERLONG_CASES[case]
    batch = collect_batch(ScriptedRunner({"q1": [q1, q1], "q3": [q3, q3]}, memory_cap,
                                        final_cap), _examples(["q1", "q3"]),
                          _config(2, dynamic=False, overlong=True, memory_cap=memory_cap,
                                  final_cap=final_cap), seed_for_try=lambda k: k)
    np.testing.assert_array_equal(batch.rewards, [[1 + p1, p1], [p3, 1 + p3]])
    assert batch.stats["reward/mean"] == pytest.approx(0.5)
    assert batch.stats["reward/shaped_mean"] == pytest.approx(0.5 + (p1 + p3) / 2)
