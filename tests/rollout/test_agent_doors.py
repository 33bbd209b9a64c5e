"""The doors a user's own agent meets (issue 81), each through `memagent-jax run --agent` as
the user meets it: one line on stderr naming the thing at fault, exit status 2, nothing on
stdout. An agent's return value is checked where every road reads it (`runner.trajectory_of`),
so `train` and `eval` say the same."""

import os
import sys
import types

import pytest

from memagent_jax.agents.tool_calling import tool
from memagent_jax.cli import main
from memagent_jax.lookup.task import words

pytestmark = pytest.mark.slow  # agents run on engines they compile

PREFIX = "memagent-jax: error: "
LOOKUP_MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "checkpoints", "lookup",
                            "start")
QUESTION = "what is the answer"


def _agent(name, rollout) -> str:
    """A module `name` defining `rollout`, importable as an agent's module."""
    module = types.ModuleType(name)
    module.rollout = rollout
    sys.modules[name] = module
    return name


async def _no_roles(row, policy):
    reply = await policy.chat([{"role": "user", "content": row.question}], max_tokens=3)
    return [[{"content": row.question}, {"content": reply.text}]]


def _run(capsys, *flags) -> tuple[int, str, list[str]]:
    """`run` with the flags: (exit status, stdout, stderr's lines)."""
    code = main(["run", "--question", QUESTION, "--temperature", "0", *flags])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def test_an_agent_returning_messages_without_roles_is_one_line_naming_them(model_dir, capsys):
    """(Exit 0 and an empty answer before; a traceback in `train`. What else an agent may
    return wrong is checked in test_agents.py, on the runner that every road shares.)"""
    name = _agent("doors_no_roles", _no_roles)
    assert _run(capsys, "--model", model_dir, "--agent", name, "--max-len", "64") == (2, "", [
        f"{PREFIX}conversation 0, message 0 must be a dict with string 'role' and 'content', "
        f"got {{'content': '{QUESTION}'}} (in agent {name}, rollout 0 of row 0)"])


def test_a_rollout_that_is_not_async_is_refused_when_the_agent_loads(model_dir, capsys):
    def rollout(row, policy):
        return [[{"role": "user", "content": row.question}]]

    name = _agent("doors_not_async", rollout)
    assert _run(capsys, "--model", model_dir, "--agent", name, "--max-len", "64") == (2, "", [
        f"{PREFIX}--agent: agent.module: {name}.rollout is not a coroutine function: the "
        "runner awaits it, so it must be `async def rollout(row, policy)`"])


@pytest.mark.parametrize("section, message", [
    ("{modul: doors_no_roles}", "agent.modul: unknown key (did you mean 'agent.module'?)"),
    ("{tools: [json:dumps]}", "agent.tools: the section names no module (`module: "
                              "my_package.my_agent`); without one its agent is MemAgent, "
                              "whose settings are the `memagent` section"),
])
def test_an_agent_section_without_module_says_so(model_dir, capsys, section, message):
    """(It spoke of MemAgent's section, as if the user had meant MemAgent.)"""
    _agent("doors_no_roles", _no_roles)
    assert _run(capsys, "--model", model_dir, "--agent", section) == (2, "", [
        f"{PREFIX}--agent: {message}"])


def test_an_agent_without_a_length_asks_for_the_flag(model_dir, capsys):
    """(It named the config key engine.max_len, which `run` has no way to set.)"""
    name = _agent("doors_no_roles", _no_roles)
    assert _run(capsys, "--model", model_dir, "--agent", name) == (2, "", [
        f"{PREFIX}--max-len must be set: agent {name} does not say how long its "
        "conversations get (it defines no max_len(tokenizer))"])


SCHEMA = {"name": "lookup", "description": "Look up the code of a key.",
          "parameters": {"type": "object",
                         "properties": {"key": {"type": "string", "description": "the key"}},
                         "required": ["key"]}}


@tool({**SCHEMA, "description": "Look up the zorblax code of a key."})
def described_in_other_words(key: str) -> str:
    return "no such key ."


@tool(SCHEMA)
def answering_in_other_words(key: str) -> str:
    return "the code is zorblax ."


@pytest.mark.parametrize("tool_function, message", [
    (described_in_other_words, "tools (as the system message declares them)"),
    (answering_in_other_words, "messages[2].content (tool)"),  # the first call's result
])
def test_a_word_the_tokenizer_cannot_read_names_the_word_and_its_message(capsys, tool_function,
                                                                         message):
    """The tool agent on the lookup model, whose word-level tokenizer reads the tools' system
    prompt as its chat template renders it (whitespace collapsed), and which calls the tool
    first: a word outside its vocabulary, in the tool's schema or in its result, is named with
    the message it is in, as `serve` names one. (It was `token id 1048779 is outside the
    model's vocabulary of 4096 ids`.)"""
    agent = ("{module: memagent_jax.agents.tool_calling, max_length: 512, "
             f"tools: ['{__name__}:{tool_function.__name__}']}}")
    code = main(["run", "--model", LOOKUP_MODEL, "--agent", agent, "--question",
                 f"what is the code of {words()[0][0]} ?", "--temperature", "0"])
    captured = capsys.readouterr()
    assert (code, captured.out, captured.err.strip().splitlines()) == (2, "", [
        f"{PREFIX}{message}: the tokenizer has no token for 'zorblax' (it reads them as pieces "
        "no model has rows for; `memagent-jax vocab --model MODEL` lists the words a model "
        "reads) (in agent tool_calling, rollout 0 of row 0)"])
