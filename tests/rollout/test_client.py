"""The server's policy handle (rollout/client.py): what each chat call of an agent asks an
OpenAI-compatible server, its request read where urlopen would send it."""

import io
import json
import types
import urllib.request

import pytest

from memagent_jax.rollout.client import Server, run_on_server, server_seed

SERVER = Server("http://127.0.0.1:1/v1", "m")


class _Answers:
    """urlopen in place of the network: records each request's body, answers "the river"."""

    def __init__(self):
        self.bodies, self.message = [], {"content": "the river"}

    def __call__(self, request, timeout):
        self.bodies.append(json.loads(request.data))
        return io.BytesIO(json.dumps({"choices": [{"message": self.message,
                                                   "finish_reason": "stop"}]}).encode())


@pytest.fixture
def answers(monkeypatch):
    answers = _Answers()
    monkeypatch.setattr(urllib.request, "urlopen", answers)
    return answers


def _agent(rollout):
    return types.SimpleNamespace(rollout=rollout, name="test")


ROW = types.SimpleNamespace(question="where is the mill ?")


async def _three_calls(row, policy):
    messages = [{"role": "user", "content": row.question}]
    for _ in range(3):
        reply = await policy.chat(messages, max_tokens=4)
        messages += [reply.message, {"role": "user", "content": "and then ?"}]
    return [messages[:-1]]


def test_each_call_of_a_seeded_rollout_asks_a_seed_of_its_own(answers):
    """A rollout's calls are sampled apart (one seed for all would draw alike where their
    prompts agree), each with the engine's seed of that call (`server_seed`), the same on a
    rerun."""
    run_on_server(SERVER, _agent(_three_calls), [ROW], 5)
    seeds = [b.get("seed") for b in answers.bodies]
    assert seeds == [server_seed(5, 0, 0, k) for k in range(3)] and len(set(seeds)) == 3
    answers.bodies.clear()
    run_on_server(SERVER, _agent(_three_calls), [ROW], 5)
    assert [b.get("seed") for b in answers.bodies] == seeds


def test_tools_are_openais_field_and_other_template_variables_chat_template_kwargs(answers):
    tools = [{"type": "function", "function": {
        "name": "weather", "description": "The temperature in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]

    replies = []

    async def with_tools(row, policy):
        reply = await policy.chat([{"role": "user", "content": row.question}], max_tokens=4,
                                  tools=tools, tool_choice="auto", enable_thinking=False)
        replies.append(reply)
        return [[reply.message]]

    run_on_server(SERVER, _agent(with_tools), [ROW], 0)
    (body,) = answers.bodies
    assert (body.get("tools"), body.get("tool_choice"), body.get("chat_template_kwargs")) == (
        tools, "auto", {"enable_thinking": False})
    assert replies[0].tool_calls is None and replies[0].tool_error is None
    # The server's calls are the reply's; a server that left them in the text (no parser of
    # its own) has them read by ours, with the error where they do not parse.
    call = {"id": "call_x", "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
    for message, calls, error in [
            ({"content": None, "tool_calls": [call]}, [call], None),
            ({"content": '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}'
                         '</tool_call>'}, [{**call, "id": "x"}], None),
            ({"content": "<tool_call>{</tool_call>"}, None, "invalid json")]:
        answers.message = message
        run_on_server(SERVER, _agent(with_tools), [ROW], 0)
        got = replies[-1]
        assert got.tool_error == error
        assert (got.tool_calls and [{**c, "id": "x"} if c["id"] != "call_x" else c
                                    for c in got.tool_calls]) == calls
        assert got.message.get("tool_calls") == got.tool_calls
