"""The lookup agent as unmodified programs on the official clients (examples/): the `openai`
client with `tools=`, and the OpenAI Agents SDK with a function tool on its chat-completions
model, each run as an agent (agents/program.py) through the engine, is recorded as the shipped
tool agent's row of the same replies: one conversation with the call, the `tool` message and
the answer, the same ids, behaviour log-probs and loss mask."""

import os
import sys

import pytest

from memagent_jax.agents.tool_calling import build as build_tool_agent
from memagent_jax.data.pipeline import example_from_row
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Scheduler
from memagent_jax.lookup import task
from memagent_jax.rollout.agent_api import load_agent
from memagent_jax.rollout.runner import AgentRunner
from memagent_jax.tokenizer import load_tokenizer
from tests.builders import ReplyEngine

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(task.write_tokenizer(str(tmp_path_factory.mktemp("lookup") / "tok")))


@pytest.mark.parametrize("example, preload", [
    ("lookup_openai.py", []), ("lookup_agents_sdk.py", []), ("lookup_openai.py", ["openai"]),
    ("lookup_agents_sdk.py", ["agents"])])
def test_an_example_program_is_recorded_as_the_shipped_tool_agent(tokenizer, example, preload):
    """As a process of its own, and forked from a server that imported its client."""
    row = example_from_row(task.make_row(7, 3), 0)
    table = dict(row.extra_info["tools_kwargs"]["lookup"]["create_kwargs"]["table"])
    key = next(k for k in table if k in row.question.split())
    end = tokenizer.eos_token_id

    def reply(prompt):  # a call of the asked key, then the code the tool gave
        text = (f"\\boxed{{ {table[key]} }}" if "<tool_response>" in prompt else
                f'<tool_call> {{"name": "lookup", "arguments": {{"key": "{key}"}}}} </tool_call>')
        return tokenizer(text, add_special_tokens=False)["input_ids"] + [end]

    shipped = build_tool_agent({"tools": ["memagent_jax.lookup.tools:lookup"], "max_turns": 2,
                                "max_tokens": 32, "max_length": 320}, None)
    program = load_agent({"module": "memagent_jax.agents.program", "max_tokens": 32,
                          "command": [sys.executable, os.path.join(ROOT, "examples", example)],
                          "preload": preload}, None)
    runner = AgentRunner(Scheduler(ReplyEngine(tokenizer, reply)), tokenizer, (end,))
    ((mine,),), ((theirs,),) = (runner.run(a, [row], SamplingParams(1.0, seed=3))
                                for a in (program, shipped))
    (a,), (b,) = mine.turns, theirs.turns  # one conversation: call, tool message, answer
    assert [m["role"] for m in a.messages] == ["user", "assistant", "tool", "assistant"]
    (call,) = a.messages[1]["tool_calls"]
    assert a.messages[2] == {"role": "tool", "tool_call_id": call["id"],
                             "content": f"the code of {key} is {table[key]} ."}
    assert (a.prompt_ids, a.response_ids, a.response_logprobs, a.response_mask) == (
        b.prompt_ids, b.response_ids, b.response_logprobs, b.response_mask)
    assert len(a.replies()) == 2 and all(lp is not None for lp in a.response_logprobs)
    assert mine.answer == theirs.answer and mine.answer.strip() == table[key]
    assert mine.metrics["tool_calls"] == theirs.metrics["tool_calls"] == 1.0
