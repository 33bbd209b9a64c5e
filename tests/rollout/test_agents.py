"""The agent interface (rollout/agent_api.py, runner.py): an agent is an async function of a
row and a policy handle; its conversations become the rows trained. MemAgent through it gives
the former loop's turns byte for byte; other agents run concurrently, share a group's first
prefill, compute tools once, and fail with one note naming the agent and the row."""

import asyncio
import sys
import types

import numpy as np
import pytest

from memagent_jax.agents.memagent.agent import MemAgent
from memagent_jax.agents.memagent.config import MemAgentConfig
from memagent_jax.data.needle import needle_rows, write_tokenizer
from memagent_jax.data.pipeline import example_from_row
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Scheduler
from memagent_jax.errors import ConfigError, UserError
from memagent_jax.models.loading import random_model
from memagent_jax.models.presets import preset_config
from memagent_jax.models.qwen import split_params
from memagent_jax.rl.rows import rows_from_trajectories
from memagent_jax.rollout.agent_api import Conversation, PromptTooLong, Rollout, load_agent
from memagent_jax.rollout.runner import AgentRunner, build_runner
from memagent_jax.tokenizer import load_tokenizer
from tests.builders import EOS, ReplyEngine
from tests.reference_memory_loop import reference_run


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(write_tokenizer(str(tmp_path_factory.mktemp("tok"))))


def _rows(count):
    return [example_from_row(r, i) for i, r in enumerate(needle_rows(count, seed=3))]


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _runner(tokenizer, reply, slots=4):
    engine = ReplyEngine(tokenizer, reply, slots=slots)
    return AgentRunner(Scheduler(engine), tokenizer, (EOS,)), engine


@pytest.mark.slow
def test_memagent_through_the_interface_is_the_former_loop_byte_for_byte(tokenizer):
    """A random tiny model samples at temperature 1 (n 3, documents of 2 and 3 chunks, fewer
    slots than trajectories): every turn's prompt, reply ids, log-probs, reply and memory are
    the a43aa52 loop's (tests/reference_memory_loop.py), float for float."""
    model = random_model(preset_config("tiny"), seed=1)
    config = MemAgentConfig(chunk_tokens=24, max_memory_tokens=8, max_final_tokens=6,
                            max_problem_tokens=8)
    agent = MemAgent(config)
    runner = build_runner(agent, model, tokenizer, EngineConfig(slots=4), None, (EOS,))
    samples = [agent.read(e.question, e.context) for e in _rows(4)]
    assert len({len(s.chunks) for s in samples}) > 1
    sampling = SamplingParams(1.0, 0.9, seed=7)
    params = split_params(model)[1]
    ours = runner.with_params(params).run(agent, samples, sampling, n=3)
    theirs = reference_run(agent, Scheduler(runner.scheduler.engine), params, samples, sampling,
                           n=3)
    for group_a, group_b in zip(ours, theirs):
        for a, b in zip(group_a, group_b):
            assert (a.problem, a.answer) == (b.problem, b.answer)
            assert len(a.turns) == len(b.turns)
            for x, y in zip(a.turns, b.turns):
                assert (x.kind, x.prompt_ids, x.response_ids, x.finish_reason, x.reply,
                        x.info) == (y.kind, y.prompt_ids, y.response_ids, y.finish_reason,
                                      y.reply, y.info)
                assert np.asarray(x.response_logprobs, np.float32).tobytes() == \
                    np.asarray(y.response_logprobs, np.float32).tobytes()
                assert x.response_mask is None  # one reply: every response id trained


async def _two_views(row, policy):
    """Two context-independent conversations asked concurrently; the first is the answer."""
    first, second = await asyncio.gather(
        policy.chat([{"role": "user", "content": row.question}], max_tokens=4),
        policy.chat([{"role": "user", "content": "the river runs past"}], max_tokens=3))
    return Rollout([[{"role": "user", "content": row.question}, first.message],
                    Conversation([second.message], kind="aside")], final=0,
                   metrics={"asked": 2.0})


def test_an_agents_conversations_become_its_rows(tokenizer):
    def reply(prompt):
        return _ids(tokenizer, "\\boxed{ tiger }" if "secret" in prompt else "the mill") + [EOS]

    runner, engine = _runner(tokenizer, reply)
    agent = types.SimpleNamespace(rollout=_two_views, name="two_views")
    groups = runner.run(agent, _rows(3), SamplingParams(0.0), n=2)
    for group in groups:
        for trajectory in group:
            final, aside = trajectory.turns
            assert (final.kind, aside.kind) == ("final", "aside")
            assert trajectory.answer.strip() == "tiger" and trajectory.metrics == {"asked": 2.0}
            assert final.caps == (4,) and aside.caps == (3,)
            assert final.response_ids == _ids(tokenizer, "\\boxed{ tiger }") + [EOS]
            assert aside.response_ids == _ids(tokenizer, "the mill") + [EOS]
    rows = rows_from_trajectories(groups, np.arange(6, dtype=np.float32).reshape(3, 2))
    assert len(rows) == 12 and rows.final.sum() == 6
    np.testing.assert_array_equal(rows.advantages, np.repeat(np.arange(6), 2))
    # A group's identical first calls are one request (one prefill a row); later calls are
    # each trajectory's own (a seed of their own): 3 rows x (1 + 2).
    assert engine.prefill_count == 9


def test_a_failing_agent_names_itself_and_the_row_and_leaves_the_runner_clean(tokenizer):
    runner, _ = _runner(tokenizer, lambda prompt: _ids(tokenizer, "the") + [EOS])

    async def flaky(row, policy):
        reply = await policy.chat([{"role": "user", "content": row.question}], max_tokens=2)
        if row.index == 1:
            raise KeyError("no such field")
        return [[reply.message]]

    agent = types.SimpleNamespace(rollout=flaky, name="flaky")
    with pytest.raises(KeyError) as error:
        runner.run(agent, _rows(3), SamplingParams(0.0), n=2)
    assert "in agent flaky, rollout 0 of row 1" in error.value.__notes__
    assert runner.scheduler.idle
    agent.rollout = _two_views
    assert len(runner.run(agent, _rows(2), SamplingParams(0.0))) == 2


@pytest.mark.parametrize("returned, message", [
    (None, "the rollout returned None, not its conversations: an agent returns a Rollout or "
           "a non-empty list of conversations"),
    ([], "the rollout returned a list ([]), not its conversations"),
    ("text", "the rollout returned a str (' the'), not its conversations"),  # 48-line tracebacks
    ("message", "the rollout returned a dict ({'role': 'assistant', 'content': ' the'}), not "),
    ("no_reply", "conversation 0 holds no reply of this rollout's chat calls"),
    ([["x"]], "conversation 0, message 0 must be a dict with string 'role' and 'content', got "
              "'x'"),
    (Rollout([[]], final=3), "Rollout.final 3 is not a conversation's index"),
])
def test_what_an_agent_returns_is_checked(tokenizer, returned, message):
    """An agent's mistake is the user's: a UserError (one line from the CLI) naming it, the
    runner's note naming the agent and the row."""
    runner, _ = _runner(tokenizer, lambda prompt: _ids(tokenizer, "the") + [EOS])

    async def agent(row, policy):
        asked = [{"role": "user", "content": row.question}]
        reply = await policy.chat(asked, max_tokens=2)
        made = {"text": reply.text, "message": dict(reply.message),
                "no_reply": [asked + [{"role": "assistant", "content": "made up"}]]}
        return made[returned] if isinstance(returned, str) else returned

    with pytest.raises(UserError) as error:
        runner.run(types.SimpleNamespace(rollout=agent, name="mine"), _rows(1),
                   SamplingParams(0.0))
    assert message in str(error.value), str(error.value)
    assert error.value.__notes__ == ["in agent mine, rollout 0 of row 0"]


def test_a_prompt_past_the_engine_is_the_agents_to_handle(tokenizer):
    runner, _ = _runner(tokenizer, lambda prompt: [EOS])
    seen = []

    async def long(row, policy):
        try:
            await policy.chat(prompt_ids=[5] * policy.max_len, max_tokens=1)
        except PromptTooLong as e:
            seen.append(str(e))
        reply = await policy.chat(prompt_ids=[5], max_tokens=1)
        return [[reply.message]]

    runner.run(types.SimpleNamespace(rollout=long), _rows(1), SamplingParams(0.0))
    assert seen and "does not fit the engine's maximum length" in seen[0]


def test_a_call_may_sample_otherwise_except_in_training(tokenizer):
    runner, _ = _runner(tokenizer, lambda prompt: _ids(tokenizer, "the") + [EOS])
    asked = []

    async def greedy_answer(row, policy):
        reply = await policy.chat([{"role": "user", "content": row.question}], max_tokens=2,
                                  temperature=0.0, top_k=5)
        asked.append(reply.text)
        return [[reply.message]]

    agent = types.SimpleNamespace(rollout=greedy_answer, name="greedy_answer")
    runner.run(agent, _rows(1), SamplingParams(1.0))
    assert asked == [" the"]
    with pytest.raises(ValueError, match=r"in training a call samples as rollout\.\* says"):
        runner.with_params(None, fixed_sampling=True).run(agent, _rows(1), SamplingParams(1.0))


def _module(name, **attributes):
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    sys.modules[name] = module
    return name


@pytest.mark.parametrize("section, key, message", [
    ({"module": "no.such.module"}, "agent.module", "cannot import 'no.such.module'"),
    ({"module": "json"}, "agent.module", "defines neither rollout(row, policy) nor build"),
    ({"module": "agents_test_bare", "tries": 3}, "agent.tries", "takes no settings"),
    ({"module": "memagent_jax.agents.single_turn", "max_tokenz": 3}, "agent.max_tokenz",
     "unknown key"),
    ({"module": "memagent_jax.agents.single_turn", "max_tokens": 0}, "agent.max_tokens",
     "must be at least 1"),
    ({"module": "memagent_jax.agents.tool_calling", "tools": ["json:nothing"]},
     "agent.tools[0]", "names no function"),
    ({"module": "memagent_jax.agents.memagent", "chunk_tokens": 5}, "agent.chunk_tokens",
     "MemAgent's settings are the `memagent` section"),
    ({"modul": "agents_test_bare"}, "agent.modul", "unknown key (did you mean 'agent.module'?)"),
    ({"module": "agents_test_sync"}, "agent.module",
     "agents_test_sync.rollout is not a coroutine function"),
])
def test_an_agent_section_is_checked_as_every_config_key(section, key, message):
    _module("agents_test_bare", rollout=_two_views)
    _module("agents_test_sync", rollout=lambda row, policy: [[]])
    with pytest.raises(ConfigError) as error:
        load_agent(section, None)
    assert key in str(error.value) and message in str(error.value)


def test_memagent_is_found_by_its_module_before_the_move():
    """A config or saved run written while MemAgent lived in rollout/ names it
    memagent_jax.rollout.memagent: that name loads MemAgent still, with its checks."""
    config = types.SimpleNamespace(memagent=MemAgentConfig(chunk_tokens=7))
    for module in ("memagent_jax.rollout.memagent", "memagent_jax.agents.memagent"):
        agent = load_agent({"module": module}, config)
        assert type(agent) is MemAgent and agent.config.chunk_tokens == 7
    with pytest.raises(ConfigError, match="agent.chunk_tokens"):
        load_agent({"module": "memagent_jax.rollout.memagent", "chunk_tokens": 5}, config)
