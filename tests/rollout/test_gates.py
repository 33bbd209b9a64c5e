"""MemAgent's gates (memagent.keep_gate, memagent.exit_gate): an update reply "keep" carries the
memory over unchanged, "exit" stops reading and answers from the memory as it was; off, the
prompts, turns and model files are the original's. Counted in the rollout's metrics, eval
records and traces."""

import asyncio
import collections
import dataclasses
import re
import types

import numpy as np
import pytest

from memagent_jax.agents.memagent.agent import MemAgent, memories_of
from memagent_jax.agents.memagent.config import MemAgentConfig
from memagent_jax.agents.memagent.templates import (
    GATE_WORDS,
    INITIAL_MEMORY,
    UPDATE_TEMPLATE,
    update_prompt,
)
from memagent_jax.data.needle import CODES, FILLER, NEEDLE, QUESTION, vocabulary, write_tokenizer
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.errors import UserError
from memagent_jax.eval.methods import AgentMethod
from memagent_jax.rl.rows import rows_from_trajectories
from memagent_jax.rollout.agent_api import Reply
from memagent_jax.synthetic import tasks as synthetic
from memagent_jax.synthetic.trace import summarize, trace_document
from memagent_jax.tokenizer import load_tokenizer
from tests.builders import EOS, ReplyEngine, on_engine

CHUNK = 8
GATED = MemAgentConfig(chunk_tokens=CHUNK, max_memory_tokens=8, max_final_tokens=8,
                       max_problem_tokens=16, keep_gate=True, exit_gate=True)
# What the agent replies, turn by turn: a memory, keep, exit; then the final answer.
SCRIPT = ["the secret code is apple .", "keep", "exit", "\\boxed{apple}"]
DOCUMENT = " ".join((FILLER * 6)[:6 * CHUNK])  # 6 chunks


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The needle task's word tokenizer, with the gates' sentences' words too."""
    gated = update_prompt("", "", "", GATE_WORDS)
    words = vocabulary([QUESTION, NEEDLE, *FILLER, *CODES, gated])
    return load_tokenizer(write_tokenizer(str(tmp_path_factory.mktemp("tok")), words))


def test_off_the_prompt_and_the_model_files_are_the_originals():
    assert update_prompt("q", "m", "c") == UPDATE_TEMPLATE.format(problem="q", memory="m",
                                                                  chunk="c")
    assert MemAgent(MemAgentConfig()).model_files()["memagent.json"].keys().isdisjoint(
        {"keep_gate", "exit_gate"})
    on = MemAgent(GATED).model_files()["memagent.json"]
    assert on["keep_gate"] is on["exit_gate"] is True
    gated = update_prompt("q", "m", "c", GATE_WORDS)
    assert "reply with the single word keep" in gated and "the single word exit" in gated
    assert gated.replace(" If the section adds nothing", "\n").split("\n")[0] in UPDATE_TEMPLATE


def test_gates_a_word_tokenizer_cannot_represent_are_refused(tmp_path):
    needle_only = load_tokenizer(write_tokenizer(str(tmp_path)))
    MemAgent(MemAgentConfig(), needle_only)
    with pytest.raises(UserError, match="memagent.exit_gate: the tokenizer has no token for "
                                        "'If', 'already', 'answers'"):
        MemAgent(MemAgentConfig(exit_gate=True), needle_only)


def _scripted(tokenizer):
    """A reply function giving SCRIPT in order, and the prompts it was given."""
    prompts = []

    def reply(prompt):
        prompts.append(prompt)
        return tokenizer(SCRIPT[len(prompts) - 1], add_special_tokens=False)["input_ids"] + [EOS]
    return reply, prompts


def _memory_of(prompt):
    """The memory a prompt holds, without spaces (the word tokenizer decodes `<memory>` as
    `< memory>` and `apple .` as `apple.`)."""
    return re.search(r"<\s*memory\s*>(.*?)<\s*/\s*memory\s*>", prompt, re.S)[1].replace(
        " ", "").strip()


def _bare(text):
    return text.replace(" ", "")


def test_keep_carries_the_memory_and_exit_answers_from_it_on_the_engine(tokenizer):
    reply, prompts = _scripted(tokenizer)
    agent, runner = on_engine(ReplyEngine(tokenizer, reply, slots=1),
                              MemAgent(GATED, tokenizer, (EOS,)))
    sample = agent.read(QUESTION, DOCUMENT)
    assert len(sample.chunks) == 6
    ((trajectory,),) = runner.run(agent, [sample], SamplingParams(0.0))
    assert [t.kind for t in trajectory.turns] == ["update"] * 3 + ["final"]  # 3 of 6 read
    assert "reply with the single word keep" in prompts[0]
    # After "keep" and after "exit" the memory is the first reply's, unchanged.
    assert [_memory_of(p) for p in prompts] == [_bare(INITIAL_MEMORY)] + [_bare(SCRIPT[0])] * 3
    assert [_bare(m) for m in memories_of(trajectory)] == [_bare(SCRIPT[0])] * 3
    assert trajectory.metrics == {"chunks_read": 3.0, "keeps": 1.0, "exits": 1.0}
    assert trajectory.answer.strip() == "apple"
    # Every turn is trained, the gates' one-word replies too.
    rows = rows_from_trajectories([[trajectory]], np.ones((1, 1)))
    trained = [tokenizer.decode([t for t, m in zip(ids, mask) if m and t != EOS])
               for ids, mask in zip(rows.tokens, rows.loss_mask)]
    assert [_bare(t) for t in trained] == [_bare(t) for t in SCRIPT]


class _TextPolicy:
    """A server's policy (takes text): the script's replies, recording the messages."""
    takes_ids, calls = False, []

    def __init__(self, script=SCRIPT):
        self.script, self.messages = script, []

    async def chat(self, messages, max_tokens, **kwargs):
        self.messages.append(messages[-1]["content"])
        text = self.script[len(self.messages) - 1]
        return Reply(text, "stop")


def test_the_gates_act_the_same_against_a_server(tokenizer):
    agent, policy = MemAgent(GATED, tokenizer, (EOS,)), _TextPolicy()
    rollout = asyncio.run(agent.rollout(agent.read(QUESTION, DOCUMENT), policy))
    assert [c.kind for c in rollout.conversations] == ["update"] * 3 + ["final"]
    assert [_memory_of(m) for m in policy.messages] == [_bare(INITIAL_MEMORY)] + [
        _bare(SCRIPT[0])] * 3
    assert rollout.metrics == {"chunks_read": 3.0, "keeps": 1.0, "exits": 1.0}


def test_every_keep_and_exit_is_counted(tokenizer):
    script = [SCRIPT[0], "keep", "keep", "exit", SCRIPT[-1]]
    agent, policy = MemAgent(GATED, tokenizer, (EOS,)), _TextPolicy(script)
    rollout = asyncio.run(agent.rollout(agent.read(QUESTION, DOCUMENT), policy))
    assert rollout.metrics == {"chunks_read": 4.0, "keeps": 2.0, "exits": 1.0}


def test_a_gate_that_is_off_is_a_memory_like_any_other(tokenizer):
    """Only the keep gate on: a reply "exit" is the new memory, and reading goes on."""
    keep_only = dataclasses.replace(GATED, exit_gate=False)
    script = ["exit", "keep", SCRIPT[0], "keep", "keep", "keep", SCRIPT[-1]]
    agent, policy = MemAgent(keep_only, tokenizer, (EOS,)), _TextPolicy(script)
    assert agent.gate("exit") is None and agent.gate("keep") == "keep"
    rollout = asyncio.run(agent.rollout(agent.read(QUESTION, DOCUMENT), policy))
    assert [c.kind for c in rollout.conversations] == ["update"] * 6 + ["final"]
    assert [_memory_of(m) for m in policy.messages] == [_bare(INITIAL_MEMORY)] + ["exit"] * 2 \
        + [_bare(SCRIPT[0])] * 4
    assert rollout.metrics == {"chunks_read": 6.0, "keeps": 4.0}


def test_an_eval_records_the_chunks_read_and_the_gates(tokenizer):
    reply, _ = _scripted(tokenizer)
    config = types.SimpleNamespace(method="memagent", memagent=GATED,
                                   sampling=types.SimpleNamespace(
                                       n=1, seed=0, temperature=0.0, top_p=1.0, top_k=0))
    method = AgentMethod(config, tokenizer)
    method.agent, method.rollouts = on_engine(ReplyEngine(tokenizer, reply, slots=1),
                                              MemAgent(GATED, tokenizer, (EOS,)))
    done = {}
    method.run("set", [(0, {"input": QUESTION, "context": DOCUMENT, "answers": ["apple"]})],
               lambda row, answers, info: done.update(info), lambda: None, lambda n: None)
    assert done["turns"] == 4 and done["agent"] == {"chunks_read": 3.0, "keeps": 1.0,
                                                    "exits": 1.0}


def test_a_trace_holds_the_memory_answered_from_for_the_chunks_an_exit_left():
    document = synthetic.make_sample("multikey", 256, 1, 0)
    words = document.context.split()
    texts = [" ".join(words[i:i + 64]) for i in range(0, len(words), 64)]
    fact = next(f.text for f in document.facts if f.needed)
    gates = {"chunks_read": 1.0, "keeps": 0.0, "exits": 1.0}
    trace = trace_document(0, document, texts, [fact], document.answer, 64, gates)
    assert trace.chunks == len(texts) and trace.gates == gates
    assert summarize([trace], 64)[-1] == f"chunks read 1 of {len(texts)}; keeps 0; exits 1"
    (traced,) = trace.facts  # held from the exit on, over no turn taken after it
    assert (traced.outcome, sum(traced.carried), sum(traced.dropped)) == ("kept", 0, 0)
    assert collections.Counter(f.outcome for f in trace.facts)["kept"] == 1
