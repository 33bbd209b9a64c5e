"""A run's limits on its rollouts (rollout/rollouts.py `Limits`, training's `rollout.timeout_s`
and `rollout.max_concurrent`): a rollout past its deadline is cancelled (its engine request
dropped), returned timed out and never trained or scored; no more rollouts than the bound are
in flight at once."""

import asyncio
import types

import numpy as np

from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Scheduler
from memagent_jax.rl.advantages import group_advantages
from memagent_jax.rl.dapo import informative_groups
from memagent_jax.rl.rows import rows_from_trajectories
from memagent_jax.rollout.rollouts import Limits
from memagent_jax.rollout.runner import AgentRunner
from tests.builders import EOS, ReplyEngine

SAMPLING = SamplingParams(1.0, seed=3)
LONG = 100_000  # tokens of the straggler's reply: only a cancelled request ends it soon


class _CountingEngine(ReplyEngine):
    """ReplyEngine that counts its decode steps."""
    steps = 0

    def generate(self, params, state, length, filled=None):
        self.steps += 1
        return super().generate(params, state, length, filled)


def _runner(word_tokenizer, reply):
    engine = _CountingEngine(word_tokenizer, reply, max_len=LONG + 64, slots=4)
    return AgentRunner(Scheduler(engine), word_tokenizer, (EOS,)), engine


def _counted_agent(calls):
    """An agent whose rollout makes `calls` chat calls in one conversation (a user turn between
    replies) and, for the row "late", then waits for ever; and `most`, whose item is the most
    rollouts in flight at once."""
    in_flight, most = [0], [0]

    async def rollout(row, policy):
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        messages = [{"role": "user", "content": row.question}]
        for k in range(calls):
            if k:
                messages.append({"role": "user", "content": "and ?"})
            messages.append((await policy.chat(messages, max_tokens=4)).message)
        if row.question == "late":
            await asyncio.Event().wait()
        in_flight[0] -= 1
        return [messages]

    return types.SimpleNamespace(rollout=rollout, name="counted"), most


def test_a_rollout_past_its_deadline_is_cancelled_and_not_trained(word_tokenizer):
    the = word_tokenizer("the", add_special_tokens=False)["input_ids"]

    def reply(prompt):  # the straggler's prompt gets a reply that would take LONG steps
        return the * (LONG if "the" in prompt.split() else 2) + [EOS]

    async def rollout(row, policy):
        messages = [{"role": "user", "content": row.question}]
        answer = await policy.chat(messages, max_tokens=LONG)
        if row.question == "is is ?":
            await asyncio.Event().wait()  # a tool that never answers
        return [messages + [answer.message]]

    agent = types.SimpleNamespace(rollout=rollout, name="stragglers")
    rows = [types.SimpleNamespace(question=q) for q in ("is ?", "the ?", "is is ?")]
    runner, engine = _runner(word_tokenizer, reply)
    groups = runner.with_limits(Limits(timeout_s=0.5)).run(agent, rows, SAMPLING, n=2)
    assert [[t.timed_out for t in g] for g in groups] == [[False] * 2, [True] * 2, [True] * 2]
    assert all(not t.turns for g in groups[1:] for t in g)
    assert engine.steps < LONG // 10  # the straggler's request was dropped, not decoded out
    assert runner.scheduler.idle
    rows_ = rows_from_trajectories(groups, group_advantages(
        np.array([[1.0, 0.0], [np.nan] * 2, [np.nan] * 2])))
    assert list(rows_.trajectory) == [0, 1]  # the fast row's two rollouts only
    assert list(rows_.advantages) == [0.5, -0.5]


def test_rewards_of_timed_out_rollouts_take_no_part_in_the_baseline():
    rewards = np.array([[1.0, np.nan, 0.0, 0.0], [1.0, 1.0, np.nan, 1.0]])
    advantages = group_advantages(rewards)
    np.testing.assert_allclose(advantages, [[2 / 3, 0, -1 / 3, -1 / 3], [0, 0, 0, 0]])
    normalized = group_advantages(rewards, normalize_std=True)
    np.testing.assert_allclose(normalized[0], np.array([2, 0, -1, -1]) / 3 / np.std(
        [1, 0, 0], ddof=1), rtol=1e-5)
    assert list(informative_groups(rewards)) == [True, False]
    assert list(informative_groups(np.full((1, 2), np.nan))) == [False]


def test_max_concurrent_bounds_the_rollouts_in_flight(word_tokenizer):
    the = word_tokenizer("the", add_special_tokens=False)["input_ids"]
    agent, most = _counted_agent(calls=2)
    rows = [types.SimpleNamespace(question=f"q{k}") for k in range(6)]
    runner, _ = _runner(word_tokenizer, lambda prompt: the * 2 + [EOS])
    groups = runner.with_limits(Limits(max_concurrent=2)).run(agent, rows, SAMPLING)
    assert most[0] == 2
    assert all(len(t.turns) == 1 and not t.timed_out for g in groups for t in g)
    most[0] = 0
    runner.run(agent, rows, SAMPLING)
    assert most[0] == 6  # unbounded, all of them at once


def test_the_server_road_keeps_the_same_limits(monkeypatch):
    """ServerRollouts: at most max_concurrent rollouts at once, a straggler timed out."""
    import io
    import json
    import urllib.request

    from memagent_jax.rollout.client import Server, ServerRollouts

    monkeypatch.setattr(urllib.request, "urlopen", lambda request, timeout: io.BytesIO(
        json.dumps({"choices": [{"message": {"content": "yes"},
                                 "finish_reason": "stop"}]}).encode()))
    agent, most = _counted_agent(calls=1)
    rows = [types.SimpleNamespace(question=q) for q in ("a", "b", "c", "d", "late")]
    rollouts = ServerRollouts(Server("http://127.0.0.1:1/v1", "m")).with_limits(
        Limits(timeout_s=0.5, max_concurrent=2))
    groups = rollouts.run(agent, rows, SAMPLING)
    assert most[0] == 2
    assert [g[0].timed_out for g in groups] == [False] * 4 + [True]
    assert groups[0][0].final_reply == "yes"
