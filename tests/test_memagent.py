"""The MemAgent loop: exact templates, chunking, memory hand-over, group mode, engine runs."""

import dataclasses
import math

import numpy as np
import pytest

from memagent_jax.errors import UserError
from memagent_jax.models import load_model, split_params
from memagent_jax.rollout.agent import build_agent
from memagent_jax.rollout.engine import DecodeEngine, EngineConfig
from memagent_jax.rollout.memagent import MemAgentConfig, MemoryAgent, chunk_ids
from memagent_jax.rollout.sampling import SamplingParams
from memagent_jax.rollout.scheduler import Scheduler
from memagent_jax.rollout.templates import chat_prompt_ids, final_prompt, update_prompt
from memagent_jax.tokenizer import load_tokenizer
from tests.hf_reference import write_hf_model, write_tiny_tokenizer

# docs/algorithm.md section 1, verbatim.
UPDATE_TEXT = (
    "You are presented with a problem, a section of an article that may contain the answer to "
    "the problem, and a previous memory. Please read the provided section carefully and update "
    "the memory with the new information that helps to answer the problem. Be sure to retain "
    "all relevant details from the previous memory while adding any new, useful information."
    "\n\n<problem> \nP\n</problem>\n\n<memory>\nM\n</memory>\n\n<section>\nC\n</section>\n\n"
    "Updated memory:\n")
FINAL_TEXT = (
    "You are presented with a problem and a previous memory. Please answer the problem based "
    "on the previous memory and put the answer in \\boxed{}.\n\n<problem> \nP\n</problem>\n\n"
    "<memory>\nM\n</memory>\n\nYour answer:\n")
EOS = 2
C = 7


def test_templates_are_byte_exact():
    assert update_prompt("P", "M", "C") == UPDATE_TEXT
    assert final_prompt("P", "M") == FINAL_TEXT


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    write_tiny_tokenizer(path)
    return load_tokenizer(str(path))


class ScriptedEngine(DecodeEngine):
    """The engine interface with a deterministic function in place of the LLM (it takes no
    parameters): the reply to an update prompt is the first two words of its section, repeated
    `repeat` times, then EOS; to the final prompt, "the" and EOS."""

    def __init__(self, tokenizer, max_len=4096, slots=2, repeat=1):
        self.tokenizer, self.repeat = tokenizer, repeat
        self.config = EngineConfig(slots=slots, max_len=max_len)
        self.prefill_count = 0

    def check_params(self, params):
        assert params is None

    def init_decode_state(self):
        return [None] * self.config.slots

    def prefill(self, params, prompts):
        return [self._script(p) for p in prompts]

    def _script(self, prompt_ids):
        self.prefill_count += 1
        text = self.tokenizer.decode(list(prompt_ids))  # word-level: words joined by spaces
        section = text.split("< section >")[-1].split("</ section >")[0]
        words = section.split() if "< section >" in text else ["the"]
        return self.tokenizer(" ".join(words[:2] * self.repeat))["input_ids"] + [EOS]

    def insert(self, script, state, slot, sampling, sample_index=0):
        state[slot] = list(script)
        return state, state[slot].pop(0), -1.0

    def generate(self, params, state):
        tokens = [s.pop(0) if s else EOS for s in state]
        return state, np.array(tokens), np.full(len(state), -1.0)


def _document(tokenizer, n):
    words = ["hello", "world", "the", "answer", "is", "memory"]
    return " ".join(words[i % len(words)] for i in range(n))


@pytest.mark.parametrize("length", [1, C - 1, C, C + 1, 10 * C])
def test_conversations_are_exactly_the_originals(tokenizer, length):
    engine = ScriptedEngine(tokenizer)
    agent = MemoryAgent(Scheduler(engine), tokenizer,
                        MemAgentConfig(chunk_tokens=C, max_memory_tokens=8, max_final_tokens=8,
                                       max_problem_tokens=16), stop_ids=(EOS,))
    document = _document(tokenizer, length)
    (trajectory,), = agent.run(None, [agent.read("what is it", document)], SamplingParams(0.0))
    turns = trajectory.turns
    assert len(turns) == math.ceil(length / C) + 1
    ids = tokenizer(document, add_special_tokens=False)["input_ids"]
    memory = "No previous memory"
    for k, turn in enumerate(turns[:-1]):
        chunk = tokenizer.decode(ids[k * C:(k + 1) * C])
        assert turn.kind == "update"
        assert turn.prompt_ids == chat_prompt_ids(tokenizer, update_prompt("what is it", memory,
                                                                           chunk))
        memory = " ".join(chunk.split()[:2])
        assert turn.reply == memory and turn.finish_reason == "stop"
    assert turns[-1].kind == "final"
    assert turns[-1].prompt_ids == chat_prompt_ids(tokenizer, final_prompt("what is it", memory))
    assert trajectory.memories == [t.reply for t in turns[:-1]]


def test_a_reply_cut_at_the_cap_is_kept_as_is(tokenizer):
    engine = ScriptedEngine(tokenizer, repeat=10)  # 20 words, cap 5
    agent = MemoryAgent(Scheduler(engine), tokenizer,
                        MemAgentConfig(chunk_tokens=C, max_memory_tokens=5, max_final_tokens=5,
                                       max_problem_tokens=16), stop_ids=(EOS,))
    (trajectory,), = agent.run(None, [agent.read("q", _document(tokenizer, 2 * C))],
                               SamplingParams(0.0))
    first, second = trajectory.turns[:2]
    assert first.finish_reason == "length" and len(first.response_ids) == 5
    assert first.reply == "hello world hello world hello"
    # word-level decoding puts spaces between the template's pieces
    assert "< memory > hello world hello world hello </ memory >" in tokenizer.decode(
        second.prompt_ids)


def test_group_mode_prefills_the_shared_first_turn_once(tokenizer):
    engine = ScriptedEngine(tokenizer, slots=3)
    agent = MemoryAgent(Scheduler(engine), tokenizer,
                        MemAgentConfig(chunk_tokens=C, max_memory_tokens=8, max_final_tokens=8,
                                       max_problem_tokens=16), stop_ids=(EOS,))
    documents = [agent.read("q", _document(tokenizer, 3 * C)),
                 agent.read("q", _document(tokenizer, C))]
    results = agent.run(None, documents, SamplingParams(1.0), n=4)
    assert [len(group) for group in results] == [4, 4]
    assert [len(t.turns) for t in results[0]] == [4] * 4
    # turns: sample 0 has 4 per trajectory, sample 1 has 2; the first turns are shared
    assert engine.prefill_count == (1 + 4 * 3) + (1 + 4 * 1)


def test_chunking_centre_truncates_to_max_chunks():
    ids = list(range(100))
    chunks = chunk_ids(ids, 10, max_chunks=4)
    assert chunks == [ids[0:10], ids[10:20], ids[80:90], ids[90:100]]
    assert chunk_ids(ids[:25], 10) == [ids[0:10], ids[10:20], ids[20:25]]


def test_budget_that_cannot_fit_the_engine_is_rejected_before_any_work(tokenizer):
    with pytest.raises(UserError, match="chunk size 5000 .* the engine holds 1024"):
        MemoryAgent(Scheduler(ScriptedEngine(tokenizer, max_len=1024)), tokenizer,
                    MemAgentConfig(), stop_ids=(EOS,))


@pytest.mark.slow
def test_documents_up_to_200k_tokens_on_a_real_model_without_recompiling(tmp_path, tokenizer,
                                                                          compilations):
    path = write_hf_model(tmp_path / "m", seed=13)
    model, _ = load_model(path)
    params = split_params(model)[1]
    config = MemAgentConfig(chunk_tokens=2000, max_memory_tokens=6, max_final_tokens=6,
                            max_problem_tokens=8)
    agent = build_agent(model, tokenizer, config,
                        EngineConfig(slots=4, max_len=2048 + 192, prefill_buckets=(64,)),
                        None, stop_ids=(EOS,))
    agent.scheduler.engine.warm_up(params)
    lengths = [200_000, 9_000, 100, 30_000, 2_000]
    samples = [agent.read("what is the answer", _document(tokenizer, n)) for n in lengths]
    with compilations() as counter:
        results = agent.run(params, samples, SamplingParams(1.0, top_p=0.9))
    assert counter.count == 0
    for n, (trajectory,) in zip(lengths, results):
        assert len(trajectory.turns) == math.ceil(n / 2000) + 1
        assert all(len(c.response_ids) <= 6 for c in trajectory.turns)
        assert all(len(c.response_logprobs) == len(c.response_ids) for c in trajectory.turns)
    assert dataclasses.asdict(results[0][0])["problem"] == "what is the answer"
