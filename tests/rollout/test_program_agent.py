"""Any program as an agent (agents/program.py): an unmodified program on the official `openai`
client, its base URL and key from the environment, is recorded as the same agent written as a
function is (ids, behaviour log-probs, conversations); a crash is one line naming the command
and the row; a program past the run's deadline is killed and its rollout timed out."""

import sys
import textwrap
import types

import pytest

from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Scheduler
from memagent_jax.errors import ConfigError, UserError
from memagent_jax.rollout.agent_api import load_agent
from memagent_jax.rollout.rollouts import Limits
from memagent_jax.rollout.runner import AgentRunner, build_runner
from tests.builders import EOS, ReplyEngine

# Two calls that continue one another (one conversation), then one of its own.
PROGRAM = """\
import json
import sys

from openai import OpenAI

row = json.load(sys.stdin)
client = OpenAI()
messages = [{"role": "user", "content": row["question"]}]
first = client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
messages += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "is it ?"}]
client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "the ?"}])
"""


async def _function(row, policy):
    """PROGRAM's calls, written as a function agent."""
    messages = [{"role": "user", "content": row.question}]
    first = await policy.chat(messages, max_tokens=4)
    messages += [first.message, {"role": "user", "content": "is it ?"}]
    second = await policy.chat(messages, max_tokens=4)
    alone = [{"role": "user", "content": "the ?"}]
    third = await policy.chat(alone, max_tokens=16)
    return [messages + [second.message], alone + [third.message]]


def _runner(word_tokenizer):
    def reply(prompt):  # a reply that depends on the prompt
        words = "the answer is" if prompt.count("?") % 2 else "is the answer"
        return word_tokenizer(words, add_special_tokens=False)["input_ids"] + [EOS]

    return AgentRunner(Scheduler(ReplyEngine(word_tokenizer, reply)), word_tokenizer, (EOS,))


def _program(tmp_path, text, **settings):
    path = tmp_path / "my_app.py"
    path.write_text(textwrap.dedent(text))
    return load_agent({"module": "memagent_jax.agents.program",
                       "command": [sys.executable, str(path)], "max_tokens": 16, **settings},
                      None)


ROWS = [types.SimpleNamespace(question=q, index=k) for k, q in enumerate(("where is it ?",
                                                                           "is the ?"))]
SAMPLING = SamplingParams(0.7, seed=11)


def test_an_openai_client_program_is_recorded_as_the_same_function_agent(
        model, params, word_tokenizer, tmp_path):
    """On the tiny model, sampled: every call's seed is the run's, the same in both."""
    function_agent = types.SimpleNamespace(rollout=_function, name="f")
    runner = build_runner(function_agent, model, word_tokenizer,
                          EngineConfig(slots=4, max_len=96), None, (EOS,)).with_params(params)
    program = runner.run(_program(tmp_path, PROGRAM), ROWS[1:], SAMPLING, n=2)
    function = runner.run(function_agent, ROWS[1:], SAMPLING, n=2)
    first, second = program[0]
    assert first.turns[0].response_ids != second.turns[0].response_ids  # seeded per rollout
    for mine, theirs in zip(sum(program, []), sum(function, [])):
        assert [t.kind for t in mine.turns] == ["turn", "final"]
        assert len(mine.turns) == len(theirs.turns) == 2
        for a, b in zip(mine.turns, theirs.turns):
            assert (a.prompt_ids, a.response_ids, a.response_logprobs, a.response_mask,
                    a.caps) == (b.prompt_ids, b.response_ids, b.response_logprobs,
                                b.response_mask, b.caps)
        assert sum(mine.turns[0].response_mask) == sum(b for b, _ in mine.turns[0].replies())
        assert len(mine.turns[0].replies()) == 2  # two replies, one row
        assert mine.final_reply == theirs.final_reply  # the last call's


def test_a_crashing_program_fails_its_rollout_in_one_line(word_tokenizer, tmp_path):
    agent = _program(tmp_path, "import json, sys\nrow = json.load(sys.stdin)\n"
                               "raise ValueError('no answer for ' + row['question'])\n")
    with pytest.raises(UserError) as failed:
        _runner(word_tokenizer).run(agent, ROWS[:1], SAMPLING)
    assert str(failed.value) == (f"agent program `{sys.executable} {tmp_path / 'my_app.py'}` "
                                 "on row 0: exited with status 1: ValueError: no answer for "
                                 "where is it ?")
    caught = _program(tmp_path, "import traceback\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n"
                                "    traceback.print_exc()\n")
    with pytest.raises(UserError, match="on row 0: wrote a traceback: ZeroDivisionError: "):
        _runner(word_tokenizer).run(caught, ROWS[:1], SAMPLING)
    quiet = _program(tmp_path, "print('nothing asked')\n")
    with pytest.raises(UserError, match="on row 0: made no chat completion at http://127.0.0.1:"):
        _runner(word_tokenizer).run(quiet, ROWS[:1], SAMPLING)
    with pytest.raises(ConfigError, match="agent.command"):
        load_agent({"module": "memagent_jax.agents.program", "command": []}, None)


def test_a_program_past_the_deadline_is_killed_and_its_rollout_timed_out(word_tokenizer,
                                                                         tmp_path):
    agent = _program(tmp_path, "import time\ntime.sleep(600)\n")
    runner = _runner(word_tokenizer).with_limits(Limits(timeout_s=1.0))
    (trajectory,), = runner.run(agent, ROWS[:1], SAMPLING)
    assert trajectory.timed_out and not trajectory.turns
