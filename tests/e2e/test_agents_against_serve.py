"""Agents against `memagent-jax serve` mean what they mean on the local engine: the shipped
lookup model (`checkpoints/lookup/final`, whose replies read back as the ids it generated)
served on loopback, and the same model here.

- `eval` of the lookup dev set (configs/eval/lookup_dev.yaml, its first rows) scores the same
  through `model.url` as locally, every answer the same: the tool agent's system prompt (line
  breaks the chat template collapses) is taken, and a conversation of several calls is one
  conversation whose last reply is the answer.
- The shipped single-turn and tool-calling agents, and an agent written here (outside the
  package: three calls in one conversation, replies sent back as plain dicts, and a
  conversation of its own beside it), give greedy the same conversations, final replies and
  answers on both roads; sampled, too, since every call asks the server for the seed the
  engine samples it with."""

import json
import os
from pathlib import Path

import openai
import pytest

from memagent_jax.agents import single_turn, tool_calling
from memagent_jax.cli import main
from memagent_jax.data.pipeline import example_from_row
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.factory import build_engine, load_model_section
from memagent_jax.engine.model_section import ModelSection
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Scheduler
from memagent_jax.lookup import task
from memagent_jax.lookup.tools import TOOL, lookup
from memagent_jax.rollout.agent_api import Rollout
from memagent_jax.rollout.chat import chat_ids
from memagent_jax.rollout.client import Server, run_on_server
from memagent_jax.rollout.runner import AgentRunner
from memagent_jax.rollout.tool_calls import declare_tools, parse_tool_calls, with_system
from tests.serve_helpers import MAX_LEN, SLOTS, serving

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "checkpoints" / "lookup" / "final")
KEY = "sk-lookup"
ROWS = 6


@pytest.fixture(scope="module")
def server():
    with serving(MODEL, api_key=KEY) as served:
        yield served


@pytest.fixture(scope="module")
def local():
    """(a runner on the engine shape the server has, the model's parameters)."""
    section = ModelSection(path=MODEL)
    policy = load_model_section(section, section.load_tokenizer(required=True), None)
    engine = build_engine(policy.model, EngineConfig(slots=SLOTS, max_len=MAX_LEN), None,
                          MAX_LEN)
    return AgentRunner(Scheduler(engine), policy.tokenizer, policy.stop_ids), policy.params


SYSTEM = declare_tools([TOOL.declaration])


async def rollout(row, policy):
    """A user's agent: the lookup tool called by hand; after the tool's result and the model's
    reply, the question is asked again in the same conversation (three calls at least); apart,
    the question alone, a conversation of its own. The first conversation is the final."""
    messages = with_system(list(row.prompt), SYSTEM)
    table = row.extra_info["tools_kwargs"]["lookup"]["create_kwargs"]["table"]
    for asked in range(2):
        for _ in range(2):
            reply = await policy.chat(messages, max_tokens=32)
            messages.append({"role": "assistant", "content": reply.text})
            calls = parse_tool_calls(reply.text).tool_calls
            if not calls:
                break
            key = json.loads(calls[0]["function"]["arguments"]).get("key", "")
            messages.append({"role": "tool", "content": lookup(key, table)})
        if not asked:
            messages.append({"role": "user", "content": row.prompt[-1]["content"]})
    alone = list(row.prompt)
    reply = await policy.chat(alone, max_tokens=8)
    return Rollout([messages, alone + [reply.message]], final=0)


class _ThisModule:
    name = "test agent"
    rollout = staticmethod(rollout)


AGENTS = {
    "single_turn": lambda: single_turn.build({"max_tokens": 32}, None),
    "tool_calling": lambda: tool_calling.build(
        {"tools": ["memagent_jax.lookup.tools:lookup"], "max_turns": 2, "max_tokens": 32},
        None),
    "test agent": _ThisModule,
}


def _read(trajectories) -> list:
    """What both roads must agree on: each trajectory's conversations (kind, messages, last
    reply), final reply and answer; tool call ids apart (a server names its calls afresh)."""
    return [[(t.final_reply, t.answer, [(turn.kind, turn.reply, [_unnamed(m) for m in
                                                                 turn.messages])
                                        for turn in t.turns]) for t in group]
            for group in trajectories]


def _unnamed(message) -> dict:
    message = {k: v for k, v in message.items() if k != "tool_call_id"}
    if "tool_calls" in message:
        message["tool_calls"] = [{k: v for k, v in c.items() if k != "id"}
                                 for c in message["tool_calls"]]
    return message


@pytest.mark.slow
@pytest.mark.parametrize("name, temperature", [("single_turn", 0.0), ("tool_calling", 0.0),
                                               ("test agent", 0.0), ("test agent", 1.0)])
def test_an_agent_on_serve_has_the_conversations_it_has_on_the_engine(server, local, name,
                                                                      temperature):
    runner, params = local
    agent = AGENTS[name]()
    if hasattr(agent, "setup"):
        agent.setup(runner.tokenizer, runner.stop_ids)
    rows = [example_from_row(task.make_row(7201, i), i) for i in range(ROWS)]
    here = runner.with_params(params).run(agent, rows, SamplingParams(temperature, 1.0, seed=5))
    there = run_on_server(Server(server.url, "m", KEY, temperature=temperature), agent, rows, 5)
    assert _read(there) == _read(here)
    if name == "test agent":
        assert {len(t.turns) for group in here for t in group} == {2}
        replies = [sum(m["role"] == "assistant" for m in t.turns[0].messages)
                   for group in here for t in group]
        assert min(replies) >= 3, replies
    if name == "tool_calling":  # the agent and task the model was trained on
        assert sum(t.answer is not None and t.answer.strip() == row.ground_truths[0]
                   for (t,), row in zip(here, rows)) >= ROWS - 1


def _samples(out) -> dict:
    with open(os.path.join(out, "samples", "eval_lookup.jsonl")) as f:
        return {r["row"]: {k: r[k] for k in ("turns", "agent", "runs", "em")}
                for r in map(json.loads, f)}


@pytest.mark.slow
def test_the_lookup_dev_set_scores_the_same_through_model_url(server, tmp_path, monkeypatch):
    sets = tmp_path / "dev"
    assert main(["data", "lookup", "--num-samples", str(ROWS), "--seed", "7201",
                 "--out", str(sets)]) == 0
    config = ["--config", str(ROOT / "configs" / "eval" / "lookup_dev.yaml"),
              f"model.path={MODEL}", f"data.sets=[{sets / 'eval_lookup.json'}]"]
    assert main(["eval", *config, f"output_dir={tmp_path / 'local'}"]) == 0
    monkeypatch.setenv("MEMAGENT_API_KEY", KEY)
    assert main(["eval", *config, f"output_dir={tmp_path / 'url'}", f"model.url={server.url}",
                 "model.served_name=m"]) == 0
    here, there = _samples(tmp_path / "local"), _samples(tmp_path / "url")
    assert there == here
    assert sum(r["em"] for r in here.values()) >= ROWS - 1


@pytest.mark.slow
def test_the_openai_client_calls_the_lookup_tool_and_the_answer_is_the_agents(server, local):
    """`tools` through the official client: the lookup model's call comes back as `tool_calls`
    the client parses (finish_reason "tool_calls"); the conversation finished with a `role:
    tool` message answers as the shipped agent answers on the engine, its prompt the very ids
    the agent's last call continued (the call rendered from its `tool_calls`, the declaration in
    the system message, as `policy.chat` renders them); a call cut at max_tokens does not parse:
    no tool_calls, its text, no 500."""
    runner, params = local
    agent = AGENTS["tool_calling"]()
    agent.setup(runner.tokenizer, runner.stop_ids)
    row = example_from_row(task.make_row(7201, 0), 0)
    ((here,),) = runner.with_params(params).run(agent, [row], SamplingParams(0.0, 1.0, seed=5))
    client = openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0, timeout=60)
    messages: list[dict] = list(row.prompt)
    first = client.chat.completions.create(model="m", messages=messages, tools=[
        TOOL.declaration], max_tokens=32, temperature=0.0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "lookup"
    key = json.loads(call.function.arguments)["key"]
    table = row.extra_info["tools_kwargs"]["lookup"]["create_kwargs"]["table"]
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": lookup(key, table)}]
    second = client.chat.completions.create(model="m", messages=messages, tools=[
        TOOL.declaration], max_tokens=32, temperature=0.0)
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == here.final_reply
    (turn,) = here.turns
    assert [m["role"] for m in turn.messages] == ["user", "assistant", "tool", "assistant"]
    last_call = turn.messages[-1].reply.prompt_ids
    assert chat_ids(runner.tokenizer, messages, tools=[TOOL.declaration]) == last_call
    assert second.usage.prompt_tokens == len(last_call)
    cut = client.chat.completions.create(model="m", messages=list(row.prompt), tools=[
        TOOL.declaration], max_tokens=4, temperature=0.0)
    assert cut.choices[0].finish_reason == "length" and not cut.choices[0].message.tool_calls
    assert cut.choices[0].message.content.startswith("<tool_call>")
