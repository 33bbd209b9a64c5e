"""The rollout contract (rollout/rollouts.py): one shape on the engine (`AgentRunner`) and on a
server (`client.ServerRollouts`): n rollouts of every row, the run's sampling, a seed per
rollout, on_call after every reply and on_done once per row."""

import io
import json
import types
import urllib.request

import pytest

from memagent_jax.agents.memagent import agent as memagent
from memagent_jax.agents.memagent.agent import MemAgent
from memagent_jax.agents.memagent.config import MemAgentConfig
from memagent_jax.data.pipeline import Example
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.rollout.client import Server, ServerRollouts
from tests.builders import EOS, ReplyEngine, on_engine

ROWS = [types.SimpleNamespace(question=q) for q in ("where is the mill ?", "what is it ?")]
SAMPLING = SamplingParams(0.5, 0.9, 3, seed=7)


async def _two_calls(row, policy):
    """One conversation of two calls."""
    messages = [{"role": "user", "content": row.question}]
    reply = await policy.chat(messages, max_tokens=4)
    messages += [reply.message, {"role": "user", "content": "and then ?"}]
    reply = await policy.chat(messages, max_tokens=4)
    return [messages + [reply.message]]


AGENT = types.SimpleNamespace(rollout=_two_calls, name="two_calls")


class _Answers:
    """urlopen in place of the network: records each request's body, answers "the answer"."""

    def __init__(self):
        self.bodies = []

    def __call__(self, request, timeout):
        self.bodies.append(json.loads(request.data))
        return io.BytesIO(json.dumps({"choices": [{"message": {"content": " the answer"},
                                                   "finish_reason": "stop"}]}).encode())


def _run(rollouts):
    """The run's trajectories, and its on_call rows and on_done (row, trajectories) in order."""
    calls, done = [], []
    groups = rollouts.run(AGENT, ROWS, SAMPLING, n=2, on_call=calls.append,
                          on_done=lambda i, trajectories: done.append((i, trajectories)))
    return groups, calls, done


@pytest.mark.parametrize("road", ["engine", "server"])
def test_both_roads_run_an_agent_over_rows_in_one_shape(word_tokenizer, monkeypatch, road):
    if road == "engine":
        def reply(prompt):
            return word_tokenizer("the answer", add_special_tokens=False)["input_ids"] + [EOS]

        agent = types.SimpleNamespace(tokenizer=word_tokenizer, stop_ids=(EOS,))
        _, rollouts = on_engine(ReplyEngine(word_tokenizer, reply), agent)
    else:
        monkeypatch.setattr(urllib.request, "urlopen", _Answers())
        rollouts = ServerRollouts(Server("http://127.0.0.1:1/v1", "m"))
    groups, calls, done = _run(rollouts)
    assert [len(group) for group in groups] == [2, 2]
    assert {t.final_reply.strip() for group in groups for t in group} == {"the answer"}
    assert sorted(calls) == [0] * 4 + [1] * 4  # 2 rollouts x 2 calls a row
    assert sorted(i for i, _ in done) == [0, 1]
    assert all(trajectories == groups[i] for i, trajectories in done)


def test_a_server_is_asked_with_the_runs_sampling_and_a_seed_a_rollout(monkeypatch):
    answers = _Answers()
    monkeypatch.setattr(urllib.request, "urlopen", answers)
    rollouts = ServerRollouts(Server("http://127.0.0.1:1/v1", "m"))
    _run(rollouts)
    assert {(b["temperature"], b["top_p"], b["top_k"]) for b in answers.bodies} == {
        (0.5, 0.9, 3)}
    first = [b["seed"] for b in answers.bodies if len(b["messages"]) == 1]
    assert len(first) == 4 and len(set(first)) == 4  # every rollout's first call its own
    seeds = sorted(b["seed"] for b in answers.bodies)
    answers.bodies.clear()
    _run(rollouts)
    assert sorted(b["seed"] for b in answers.bodies) == seeds  # the same seed, the same asks


def test_with_params_binds_a_copy(word_tokenizer):
    """The engine's implementation holds the parameters it samples with; binding them makes a
    runner of its own on the same scheduler, the one bound from left as it was."""
    agent = types.SimpleNamespace(tokenizer=word_tokenizer, stop_ids=(EOS,))
    _, runner = on_engine(ReplyEngine(word_tokenizer, lambda prompt: [EOS]), agent)
    bound = runner.with_params("params", fixed_sampling=True)
    assert (bound.params, bound.fixed_sampling) == ("params", True)
    assert (runner.params, runner.fixed_sampling) == (None, False)
    assert bound.scheduler is runner.scheduler


def test_memagent_reads_a_rows_document_once_for_its_n_rollouts(word_tokenizer, monkeypatch):
    reads = []
    real = memagent.read_sample

    def read_sample(*args, **kwargs):
        reads.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(memagent, "read_sample", read_sample)
    agent, runner = on_engine(
        ReplyEngine(word_tokenizer, lambda prompt: [EOS], slots=3),
        MemAgent(MemAgentConfig(chunk_tokens=4, max_memory_tokens=4, max_final_tokens=4,
                                max_problem_tokens=8), word_tokenizer, (EOS,)))
    rows = [Example(i, "", "what is it", document, ("x",)) for i, document in
            enumerate(["hello world the answer is memory", "the answer is hello"])]
    groups = runner.run(agent, rows, SamplingParams(1.0, seed=1), n=3)
    assert [[len(t.turns) for t in group] for group in groups] == [[3] * 3, [2] * 3]
    assert reads == [row.context for row in rows]
