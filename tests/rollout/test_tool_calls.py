"""Tool calls in OpenAI's shape (rollout/tool_calls.py) and the shipped tool agent on them.

The parser's reference is vLLM's hermes parser (`--tool-call-parser hermes`): its documented
outputs (tests/tool_use/test_hermes_tool_parser.py: `finish_reason == "tool_calls"`,
`tool_call.type == "function"`, `function.arguments` JSON text; the content the text before
the first call, None when empty; several calls a list; a reply that does not parse keeps its
text and calls nothing). The agent's gaps each have a test here that fails on the mutation."""

import asyncio
import json
import os

import pytest

from memagent_jax.agents.tool_calling import build as build_tool_agent
from memagent_jax.data.pipeline import example_from_row
from memagent_jax.lookup import task
from memagent_jax.lookup.tools import TOOL
from memagent_jax.rollout.agent_api import PromptTooLong, Reply
from memagent_jax.rollout.chat import chat_ids
from memagent_jax.rollout.tool_calls import (
    declare_tools,
    parse_tool_calls,
    read_reply,
    render_input,
    takes_tools,
    with_calls,
    with_system,
)
from memagent_jax.tokenizer import load_tokenizer
from tests.builders import qwen_like_tokenizer

QWEN2 = os.path.join(os.path.dirname(os.path.dirname(__file__)), "original_chat_template",
                     "Qwen2TokenizerFast.j2")


def _ids(k):
    return f"id{k}"


def _function(call):
    return call["function"]["name"], json.loads(call["function"]["arguments"])


def test_a_call_reads_as_openais_tool_call_and_the_text_before_it_is_the_content():
    parsed = parse_tool_calls('<tool_call>\n{"name": "get_current_weather", "arguments": '
                              '{"location": "Boston, MA", "unit": "celsius"}}\n</tool_call>',
                              _ids)
    (call,) = parsed.tool_calls
    assert call["id"] == "id0" and call["type"] == "function"
    assert isinstance(call["function"]["arguments"], str)
    assert _function(call) == ("get_current_weather", {"location": "Boston, MA",
                                                       "unit": "celsius"})
    assert parsed.content is None and parsed.error is None
    said = parse_tool_calls('Let me check. <tool_call>{"name": "f", "arguments": '
                            '{"n": 7355608, "b": true}}</tool_call>')
    assert said.content == "Let me check. " and _function(said.tool_calls[0]) == (
        "f", {"n": 7355608, "b": True})
    assert said.tool_calls[0]["id"].startswith("call_")
    assert parse_tool_calls("no call here") == parse_tool_calls("no call here", _ids)
    assert parse_tool_calls("no call here").tool_calls == []
    assert parse_tool_calls("no call here").content == "no call here"


def test_several_calls_are_a_list_in_order_not_one_call():
    """The gap: a greedy pattern reads `<tool_call>A</tool_call> <tool_call>B</tool_call>` as
    one call of invalid JSON."""
    text = ('<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    parsed = parse_tool_calls(text, _ids)
    assert parsed.error is None
    assert [(c["id"], *_function(c)) for c in parsed.tool_calls] == [
        ("id0", "a", {"x": 1}), ("id1", "b", {})]


def test_a_last_call_left_open_counts_and_a_call_that_does_not_parse_calls_nothing():
    assert _function(parse_tool_calls('<tool_call>{"name": "a"}').tool_calls[0]) == ("a", {})
    for text, error in [("<tool_call>{oops</tool_call>", "invalid json"),
                        ('<tool_call>{"name": "a"}</tool_call><tool_call>{"x</tool_call>',
                         "invalid json"),
                        ('<tool_call>{"name": ""}</tool_call>', "tool name not found"),
                        ('<tool_call>["a"]</tool_call>', "tool name not found"),
                        ('<tool_call>{"name": "a", "arguments": [1]}</tool_call>',
                         "arguments must be a json object")]:
        parsed = parse_tool_calls(text)
        assert (parsed.content, parsed.tool_calls, parsed.error) == (text, [], error)
    # A word-level tokenizer decodes a space before every word: strings are stripped.
    spaced = parse_tool_calls('<tool_call>{" name": " x", " arguments": {" k": " v"}}'
                              '</tool_call>')
    assert _function(spaced.tool_calls[0]) == ("x", {"k": "v"})


def test_a_reply_read_for_calls_carries_them_in_its_message():
    reply = read_reply(Reply('ok <tool_call>{"name": "a", "arguments": {}}</tool_call>',
                             "stop"), _ids)
    assert reply.text.startswith("ok <tool_call>") and reply.tool_error is None
    assert dict(reply.message) == {"role": "assistant", "content": "ok ",
                                   "tool_calls": reply.tool_calls}
    assert reply.message.reply is reply
    bad = read_reply(Reply("<tool_call>{</tool_call>", "stop"))
    assert bad.tool_calls is None and bad.tool_error == "invalid json"
    assert dict(bad.message) == {"role": "assistant", "content": "<tool_call>{</tool_call>"}


@pytest.fixture(scope="module")
def lookup_tokenizer(tmp_path_factory):
    return load_tokenizer(task.write_tokenizer(str(tmp_path_factory.mktemp("lookup"))))


def test_a_template_without_tools_gets_them_in_the_system_message_as_the_agent_declared_them(
        lookup_tokenizer):
    """The lookup model's template takes no `tools`: the prompt is the one the shipped agent
    sent before (its system prompt, Qwen2.5's words), byte for byte."""
    tools = [TOOL.declaration]
    user = [{"role": "user", "content": "what is the code of nakodo ?"}]
    by_hand = with_system(user, declare_tools(tools))
    assert by_hand[0]["content"].startswith("# Tools\n\nYou may call one or more functions")
    assert chat_ids(lookup_tokenizer, user, tools=tools) == chat_ids(lookup_tokenizer, by_hand)
    system = [{"role": "system", "content": "be brief ."}, *user]
    assert chat_ids(lookup_tokenizer, system, tools=tools) == chat_ids(
        lookup_tokenizer, with_system(system, declare_tools(tools)))
    assert with_system(system, "x")[0]["content"] == "be brief .\n\nx"


def test_a_template_with_tools_renders_them_and_the_calls_of_assistant_messages(lookup_tokenizer):
    """Qwen2.5's template (the original's, tests/original_chat_template) takes `tools` and
    writes an assistant message's `tool_calls` with their arguments as objects (OpenAI's
    arguments are JSON text: given to the template parsed, as vLLM gives them); a template
    that writes no tool_calls gets them as `<tool_call>` text."""
    with open(QWEN2, encoding="utf-8") as f:
        template = f.read()
    tokenizer = qwen_like_tokenizer([template, declare_tools([TOOL.declaration])], template)
    call = {"id": "c1", "type": "function",
            "function": {"name": "lookup", "arguments": '{"key": "nakodo"}'}}
    messages = [{"role": "user", "content": "the code of nakodo ?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "the code of nakodo is x"}]
    rendered, variables = render_input(tokenizer, messages, {"tools": [TOOL.declaration]})
    assert variables == {"tools": [TOOL.declaration]} and rendered[0] == messages[0]
    assert rendered[1]["tool_calls"][0]["function"]["arguments"] == {"key": "nakodo"}
    text = tokenizer.decode(chat_ids(tokenizer, messages, tools=[TOOL.declaration]))
    assert '<tools>\n{"type": "function", "function": {"name": "lookup"' in text
    assert ('<tool_call>\n{"name": "lookup", "arguments": {"key": "nakodo"}}\n</tool_call>'
            in text)
    assert "<tool_response>\nthe code of nakodo is x\n</tool_response>" in text
    assert takes_tools(template) and not takes_tools(lookup_tokenizer.chat_template)
    assert not takes_tools("{# no tools here #}{{ messages[0].content }} tools")
    plain = qwen_like_tokenizer(["x"], "{% for m in messages %}{{ m.content }}|{% endfor %}")
    (_, written, _), _ = render_input(plain, messages, {})
    assert written == {"role": "assistant", "content": '<tool_call>\n{"name": "lookup", '
                                                       '"arguments": {"key": "nakodo"}}\n'
                                                       '</tool_call>'}


# ---- the shipped tool agent

def sized(key: str) -> dict:
    """A key's size.

    Args:
        key: the word
    """
    return {"key": key, "size": len(key)}


def secret(key: str, user: str) -> str:
    """A key's secret, for a user.

    Args:
        key: the word
        user: who asks
    """
    return f"{user} may read {key}"


def raising(key: str) -> str:
    """Fails.

    Args:
        key: the word
    """
    raise KeyError(key)


class Scripted:
    """A policy whose replies are `texts` in turn (read for calls as the engine's are), that
    records every call's messages and tools, and raises PromptTooLong from call `too_long`
    on."""
    takes_ids = False
    tokenizer = max_len = None

    def __init__(self, texts, too_long=None):
        self.texts, self.too_long, self.asked = list(texts), too_long, []

    async def chat(self, messages, *, max_tokens, tools=None, **_):
        self.asked.append(([dict(m) for m in messages], tools))
        if self.too_long is not None and len(self.asked) > self.too_long:
            raise PromptTooLong("the prompt leaves no room")
        reply = Reply(self.texts.pop(0) if self.texts else "\\boxed{done}", "stop")
        return read_reply(reply, lambda k: f"c{len(self.asked)}_{k}") if tools else reply

    async def once(self, fn, *args):
        return fn(*args)


def _agent(*tools, max_turns=3):
    return build_tool_agent({"tools": [f"{__name__}:{t}" for t in tools],
                             "max_turns": max_turns}, None)


def _row(extra_info=None):
    return example_from_row({"data_source": "t", "prompt": "which size has nakodo ?",
                             "reward_model": {"ground_truth": "6"},
                             "extra_info": extra_info or {}}, 0)


def _call(name, **arguments):
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def _tool_messages(rollout):
    return [(m.get("tool_call_id"), m["content"]) for m in rollout.conversations[0]
            if m["role"] == "tool"]


def test_the_agent_calls_through_policy_chat_with_tools_and_answers_each_call_by_its_id():
    """Two calls in one reply: both run, each answered with its call's id; a non-string result
    reaches the model as JSON, not as a Python repr (the gap)."""
    agent = _agent("sized")
    policy = Scripted([_call("sized", key="nakodo") + _call("sized", key="ab")])
    rollout = asyncio.run(agent.rollout(_row(), policy))
    assert policy.asked[0] == ([{"role": "user", "content": "which size has nakodo ?"}],
                               [agent.tools["sized"].declaration])
    assert _tool_messages(rollout) == [("c1_0", '{"key": "nakodo", "size": 6}'),
                                       ("c1_1", '{"key": "ab", "size": 2}')]
    assert rollout.conversations[0][1]["tool_calls"][1]["id"] == "c1_1"
    assert rollout.metrics == {"tool_calls": 2.0, "tool_errors": 0.0, "tool_parse_errors": 0.0}


def test_a_call_that_runs_no_tool_is_told_to_the_model_and_a_parse_error_is_counted():
    """The original's way: the tool message says what went wrong and repeats nothing the model
    wrote; missing required arguments are reported (the gap) as unknown ones are; a reply
    that does not parse gets its error as the tool message, counted."""
    agent = _agent("sized", "raising", max_turns=5)
    assert agent.tools["sized"].schema["parameters"]["required"] == ["key"]
    policy = Scripted([_call("search"), _call("sized", word="zebra"), _call("sized"),
                       "<tool_call>{oops</tool_call>", _call("raising", key="k")])
    rollout = asyncio.run(agent.rollout(_row(), policy))
    told = [content for _, content in _tool_messages(rollout)]
    assert told == ["error: unknown tool", "error: sized takes key (required: key)",
                    "error: sized takes key (required: key)", "error: invalid json",
                    "error: KeyError: 'k'"]
    assert _tool_messages(rollout)[3] == (None, "error: invalid json")
    assert rollout.metrics == {"tool_calls": 5.0, "tool_errors": 5.0, "tool_parse_errors": 1.0}
    assert "zebra" not in " ".join(told) and "search" not in " ".join(told)


def test_the_rows_hidden_arguments_win_over_the_models():
    """`user` is in the schema, so the model may pass it; the row's create_kwargs say who
    asks, and the tool sees the row's (the gap: the model's overriding them)."""
    agent = _agent("secret", max_turns=1)
    row = _row({"tools_kwargs": {"secret": {"create_kwargs": {"user": "ann"}}}})
    rollout = asyncio.run(agent.rollout(row, Scripted([_call("secret", key="k",
                                                             user="mallory")])))
    assert _tool_messages(rollout) == [("c1_0", "ann may read k")]


def test_a_prompt_too_long_ends_the_conversation_it_does_not_fail_the_rollout():
    agent = _agent("sized")
    rollout = asyncio.run(agent.rollout(_row(), Scripted([_call("sized", key="k")] * 3,
                                                         too_long=2)))
    assert [m["role"] for m in rollout.conversations[0]] == ["user", "assistant", "tool",
                                                            "assistant", "tool"]
    assert rollout.metrics["tool_calls"] == 2.0


def test_the_agent_stops_after_max_turns_replies_that_call():
    agent = _agent("sized", max_turns=2)
    policy = Scripted([_call("sized", key="k")] * 5)
    rollout = asyncio.run(agent.rollout(_row(), policy))
    assert len(policy.asked) == 3 and rollout.metrics["tool_calls"] == 2.0


@pytest.mark.parametrize("arguments, told", [('{"key": ', "error: invalid json"),
                                             ('["k"]', "error: arguments must be a json object")])
def test_a_servers_call_whose_arguments_do_not_parse_is_told_not_raised(arguments, told):
    """Another server's parser may pass on arguments that are no JSON object (NeMo Gym #605:
    malformed JSON crashed the run): the model is told, as of a call ours does not parse."""

    class Server(Scripted):
        async def chat(self, messages, *, max_tokens, tools=None, **_):
            self.asked.append(messages)
            return with_calls(Reply("", "tool_calls"), "", [{"id": "s", "type": "function",
                                                             "function": {
                "name": "sized", "arguments": arguments}}], None)

    rollout = asyncio.run(_agent("sized", max_turns=1).rollout(_row(), Server([])))
    assert _tool_messages(rollout) == [("s", told)]
