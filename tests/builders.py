"""Builders shared by test modules in more than one file: small inputs and models that several
tests build alike. (Fixtures are in conftest.py; the transformers reference in hf_reference.py;
jobs of several processes in multiprocess.py; the served tiny model in serve_helpers.py.)"""

import json
import os
import sys

import jax.numpy as jnp
import numpy as np

from memagent_jax.agents.memagent.config import MemAgentConfig
from memagent_jax.engine.engine_api import DecodeEngine, EngineConfig
from memagent_jax.eval.config import EvalConfig
from memagent_jax.eval.methods import Answer
from memagent_jax.models.config import ModelConfig
from memagent_jax.rl.rows import rows_from_trajectories
from memagent_jax.rollout.agent_api import Trajectory, Turn
from memagent_jax.rollout.answers import final_answer
from memagent_jax.runconfig import load_config

# ---- HotpotQA: data, eval and serve tests

# Hand-written HotpotQA rows (official layout): two gold paragraphs each, then distractors.
GOLD = [
    ("Which country is the Eiffel Tower's architect's firm based in?", "France",
     [["Eiffel Tower", ["The Eiffel Tower is a lattice tower in Paris. ",
                        "It was built by the company of Gustave Eiffel."]],
      ["Gustave Eiffel", ["Gustave Eiffel was a French civil engineer. ",
                          "His firm was based in France."]]]),
    ("Were Ada Lovelace and Charles Babbage both English?", "yes",
     [["Ada Lovelace", ["Ada Lovelace was an English mathematician."]],
      ["Charles Babbage", ["Charles Babbage was an English polymath. ",
                           "He designed the Analytical Engine."]]]),
    ("In what year was the river crossed by the Golden Gate Bridge's strait named?", "1846",
     [["Golden Gate Bridge", ["The Golden Gate Bridge spans the Golden Gate strait."]],
      ["Golden Gate", ["The Golden Gate strait was named in 1846 by John C. Fremont."]]]),
    ("Who wrote the novel that the film Blade Runner is based on?", "Philip K. Dick",
     [["Blade Runner", ["Blade Runner is a 1982 film. ",
                        "It is based on Do Androids Dream of Electric Sheep?"]],
      ["Do Androids Dream of Electric Sheep?", ["The novel was written by Philip K. Dick."]]]),
    ("Which instrument did the founder of the band Queen's guitarist build?", "Red Special",
     [["Queen (band)", ["Queen were a British rock band. ", "Brian May was its guitarist."]],
      ["Brian May", ["Brian May built the Red Special guitar with his father."]]]),
]
TOPICS = ["Harbor", "Mountain", "Library", "Orchestra", "Comet", "Glacier", "Vineyard",
          "Lighthouse", "Desert", "Monastery", "Railway", "Volcano", "Canal", "Observatory"]


def _distractor(k: int) -> list:
    topic = TOPICS[k % len(TOPICS)]
    return [f"{topic} {k}", [f"The {topic.lower()} number {k} is a well known place. ",
                             f"Visitors describe it as remarkable in season {k % 4}."]]


def hotpot_rows() -> list[dict]:
    """Each question: its 2 gold paragraphs + 8 distractors (shared between questions, as
    HotpotQA dev paragraphs sometimes are)."""
    rows = []
    for i, (question, answer, gold) in enumerate(GOLD):
        distractors = [_distractor(3 * i + j) for j in range(8)]
        rows.append({"_id": f"q{i}", "question": question, "answer": answer,
                     "type": "bridge", "level": "easy", "context": gold + distractors})
    return rows


# ---- Replies: answer extraction (rollout) and rewards (rl) against the original

def random_replies(count: int, seed: int = 0) -> list[str]:
    """Replies glued from the pieces the extraction rules look at, for comparisons with the
    original beyond the hand-picked probes."""
    import random
    pieces = ["\\boxed", "\\boxed ", "\\boxed{", "\\fbox{", "{", "}", "$", " ", "\n", "Paris",
              "x", "</think>", ".", "\\%", "\\frac", "=", "0.5", "1/2"]
    rng = random.Random(seed)
    return ["".join(rng.choices(pieces, k=rng.randrange(12))) for _ in range(count)]


# ---- The learner tests' model and rows (rl)

# tests/hf_reference.TINY's shape; vocab 64 so that the tensor axis divides it too
LEARNER_MODEL = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                            num_heads=4, num_kv_heads=2, head_dim=8)


def random_rows(seed=0, trajectories=12):
    """Multi-conversation trajectories (1 to 3 turns) with random tokens and advantages."""
    rng = np.random.RandomState(seed)
    flat = []
    for _ in range(trajectories):
        turns = []
        for _ in range(1 + rng.randint(3)):
            p, n = 4 + rng.randint(8), 2 + rng.randint(6)
            turns.append(Turn("update", list(rng.randint(3, 64, p)), list(rng.randint(3, 64, n)),
                              list(-rng.uniform(2, 5, n)), "length", ""))
        flat.append(Trajectory("", turns))
    return rows_from_trajectories(flat, rng.randn(trajectories))


# ---- The supervised warm-up's model and budgets (synthetic: its conftest's `agent`)

SFT_MODEL = ModelConfig(vocab_size=4096, hidden_size=32, intermediate_size=48, num_layers=2,
                        num_heads=4, num_kv_heads=2, head_dim=8)
SFT_BUDGETS = MemAgentConfig(chunk_tokens=64, max_memory_tokens=40, max_final_tokens=8,
                             max_problem_tokens=16)


# ---- The decode step's cache (models: the XLA ragged read and the Pallas kernels)

def decode_cache(lengths, s, t, hq, hkv, seed, d=8, dtype=jnp.float32):
    """q [B, T, Hq, D], k_cache [B, Hkv, D, S], v_cache [B, Hkv, S, D], lengths [B] int32."""
    r = np.random.default_rng(seed)
    b = len(lengths)
    q = jnp.asarray(r.standard_normal((b, t, hq, d)) * 2, dtype)
    k = jnp.asarray(r.standard_normal((b, hkv, d, s)) * 2, dtype)
    v = jnp.asarray(r.standard_normal((b, hkv, s, d)), dtype)
    return q, k, v, jnp.asarray(lengths, jnp.int32)


def length_mask(lengths, t, s):
    """[B, T, S] bool: position s visible to row b's queries where s < lengths[b]."""
    return jnp.broadcast_to(jnp.arange(s)[None, None] < lengths[:, None, None],
                            (len(lengths), t, s))


# ---- Doubles of the model: the memory agent's engine (rollout) and an eval method (eval)

# The scripted engine's end-of-text id (the tiny word-level tokenizers' "</s>").
EOS = 2


def scripted_logprob(token: int, position: int) -> float:
    """The log-probability `ScriptedEngine` gives `token` at `position` of its reply: distinct
    from one position to the next, so a log-prob one place off in a row shows."""
    return -0.125 * (1 + position % 8) - 0.015625 * (token % 4)


class ScriptedEngine(DecodeEngine):
    """The engine interface with a deterministic function in place of the LLM (it takes no
    parameters): the reply to an update prompt is the first two words of its section, repeated
    `repeat` times, then EOS; to the final prompt, "the" and EOS. Token k of a reply has
    log-probability `scripted_logprob(token, k)`."""

    def __init__(self, tokenizer, max_len=4096, slots=2, repeat=1):
        self.tokenizer, self.repeat = tokenizer, repeat
        self.config = EngineConfig(slots=slots, max_len=max_len)
        self.max_len = max_len
        self.vocab_size = len(tokenizer.get_vocab())
        self.prefill_count = 0

    def check_params(self, params):
        assert params is None

    def place(self, params):
        self.check_params(params)
        return params

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
        state[slot] = [list(script), 0]  # the tokens left, the next one's position
        return state, *self._next(state[slot])

    def generate(self, params, state, length, filled=None):
        tokens, logprobs = zip(*(self._next(s) for s in state))
        return state, np.array(tokens), np.array(logprobs, np.float32)

    @staticmethod
    def _next(slot) -> tuple[int, float]:
        """A slot's next token and its log-prob (a free slot's: EOS)."""
        if slot is None or not slot[0]:
            return EOS, 0.0
        token, slot[1] = slot[0].pop(0), slot[1] + 1
        return token, scripted_logprob(token, slot[1] - 1)


class Scripted:
    """A method with canned replies instead of a model: reply(set, row, k) for sample k.
    fail_after: raise (a crash) once that many questions have finished in this run."""

    def __init__(self, reply, n=2, fail_after=None, crash=RuntimeError("injected crash")):
        self.reply, self.n, self.fail_after, self.crash = reply, n, fail_after, crash
        self.finished, self.started = [], False

    def check(self, where, row, record):
        pass

    def start(self):
        self.started = True

    def run(self, set_name, batch, on_done, on_turn, add_turns):
        add_turns(self.n * len(batch))
        for row, record in batch:
            if self.fail_after is not None and len(self.finished) == self.fail_after:
                raise self.crash
            answers = []
            for k in range(self.n):
                on_turn()
                text = self.reply(set_name, row, k)
                answers.append(Answer(final_answer(text), text, "stop", 3))
            on_done(row, answers, {"context_tokens": len(record["context"].split()),
                                   "turns": 1})
            self.finished.append((set_name, row))


# The eval tests' config: configs/eval/tiny_cpu.yaml on the given model, sets and output.
EVAL_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "configs", "eval", "tiny_cpu.yaml")


def eval_config(model_dir, sets, out, *overrides) -> EvalConfig:
    return load_config(EvalConfig, EVAL_CONFIG, [f"model.path={model_dir}",
                                                 f"data.sets={json.dumps(sets)}",
                                                 f"output_dir={out}", *overrides])


# ---- Optional dependencies: extras, train and eval tests

def block_package(monkeypatch, package: str) -> None:
    """`package` and its submodules fail to import (ModuleNotFoundError) for the rest of the
    test, as if it were not installed."""
    for name in [n for n in sys.modules if n.startswith(package + ".")] + [package]:
        monkeypatch.setitem(sys.modules, name, None)


# ---- Agents: a byte-level BPE of Qwen's kind, and an engine that replies by script

def qwen_like_tokenizer(texts: list[str], chat_template: str, vocab_size: int = 600):
    """A byte-level BPE trained here on `texts`, with Qwen's special tokens (<|endoftext|>
    padding, <|im_start|>, <|im_end|> end-of-turn) and `chat_template`: Qwen's kind of
    tokenizer, where a text has one canonical tokenization and others that decode to it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>",
                                      pad_token="<|endoftext|>")
    wrapped.chat_template = chat_template
    return wrapped


class ReplyEngine(ScriptedEngine):
    """Replies reply(prompt text) (ids, the end token included) to every prompt."""

    def __init__(self, tokenizer, reply, max_len=4096, slots=4):
        super().__init__(tokenizer, max_len, slots)
        self.reply = reply

    def _script(self, prompt_ids):
        self.prefill_count += 1
        return list(self.reply(self.tokenizer.decode(list(prompt_ids))))


def on_engine(engine, agent):
    """(agent, an AgentRunner on a scheduler of `engine`, with the agent's tokenizer and stop
    ids): an agent set up (MemAgent given its tokenizer) and where it runs, no model loaded."""
    from memagent_jax.engine.scheduler import Scheduler
    from memagent_jax.rollout.runner import AgentRunner

    return agent, AgentRunner(Scheduler(engine), agent.tokenizer, agent.stop_ids)


async def two_conversations(row, policy):
    """An agent of two conversations: two calls (a user turn between the replies), then one call
    alone (tests/rollout/test_program_agent.py's PROGRAM, written as a function agent)."""
    messages = [{"role": "user", "content": row.question}]
    first = await policy.chat(messages, max_tokens=4)
    messages += [first.message, {"role": "user", "content": "is it ?"}]
    second = await policy.chat(messages, max_tokens=4)
    alone = [{"role": "user", "content": "the ?"}]
    third = await policy.chat(alone, max_tokens=16)
    return [messages + [second.message], alone + [third.message]]
