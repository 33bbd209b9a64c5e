"""`memagent.thinking: keep | strip | off` (docs/algorithm.md section 7, item 11) on the local
engine: with a Qwen3-like word-level tokenizer (`write_tiny_tokenizer(thinking=True)`) and a
scripted engine whose replies think first, the memories, prompts and answers of each setting;
the strip rule in ids and in text; a model that never thinks reads the same under all three;
`off` end to end on a tiny random model through `build_runner`; a bad value is one clear line."""

import random
from pathlib import Path

import pytest

from memagent_jax.agents.memagent.agent import MemAgent, memories_of
from memagent_jax.agents.memagent.config import MemAgentConfig
from memagent_jax.agents.memagent.templates import final_prompt, update_prompt
from memagent_jax.cli import main
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.errors import ConfigError
from memagent_jax.rollout.answers import final_answer
from memagent_jax.rollout.chat import chat_prompt_ids
from memagent_jax.rollout.thinking import THINKING_CHOICES, strip_thinking_ids, strip_thinking_text
from memagent_jax.tokenizer import load_tokenizer
from tests.builders import EOS, ScriptedEngine, on_engine
from tests.hf_reference import write_tiny_model, write_tiny_tokenizer

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
THOUGHT = "<think> the answer is hello </think> memory hello"  # every update reply
FINAL = "<think> \\boxed world </think> \\boxed hello"  # the final reply: its answer is hello
QUESTION = "what is it"
C = 7


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    write_tiny_tokenizer(path, thinking=True)
    return load_tokenizer(str(path))


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class ThinkingEngine(ScriptedEngine):
    """Replies THOUGHT to every update prompt and FINAL to the final prompt, then EOS."""

    def _script(self, prompt_ids):
        self.prefill_count += 1
        update = "< section >" in self.tokenizer.decode(list(prompt_ids))
        return _ids(self.tokenizer, THOUGHT if update else FINAL) + [EOS]


def _config(thinking):
    return MemAgentConfig(chunk_tokens=C, max_memory_tokens=16, max_final_tokens=16,
                          max_problem_tokens=16, thinking=thinking)


def _document(n):
    words = ["hello", "world", "the", "answer", "is", "memory"]
    return " ".join(words[i % len(words)] for i in range(n))


@pytest.mark.parametrize("thinking, memory", [("keep", THOUGHT), ("strip", "memory hello"),
                                              ("off", THOUGHT)])
def test_each_setting_carries_its_memory_and_renders_its_prompts(qwen3, thinking, memory):
    """keep: the whole reply, thinking included, is the next memory; strip: what follows its
    last </think>; off: as keep, and every prompt ends in the empty think block. A turn's reply
    and response ids are the whole reply in all three; the answer is the final reply's after
    its last </think> in all three."""
    agent, runner = on_engine(ThinkingEngine(qwen3),
                            MemAgent(_config(thinking), qwen3, (EOS,)))
    sample = agent.read(QUESTION, _document(2 * C))
    (trajectory,), = runner.run(agent, [sample], SamplingParams(0.0))
    turns = trajectory.turns
    assert [t.kind for t in turns] == ["update", "update", "final"]
    assert [t.reply for t in turns] == [THOUGHT, THOUGHT, FINAL]
    assert [t.response_ids for t in turns] == [_ids(qwen3, r) + [EOS]
                                               for r in (THOUGHT, THOUGHT, FINAL)]
    assert memories_of(trajectory) == [memory, memory]
    assert trajectory.answer == "hello"

    chunks = [qwen3.decode(list(c)) for c in sample.chunks]
    expected = [update_prompt(QUESTION, "No previous memory", chunks[0]),
                update_prompt(QUESTION, memory, chunks[1]), final_prompt(QUESTION, memory)]
    assert [t.prompt_ids for t in turns] == [chat_prompt_ids(qwen3, m, thinking)
                                             for m in expected]
    assert f"< memory > {memory} </ memory >" in qwen3.decode(turns[1].prompt_ids)
    think_block = _ids(qwen3, "<think> </think>")
    assert [t.prompt_ids[-2:] == think_block for t in turns] == [thinking == "off"] * 3

    record = trajectory.record()
    assert record["memories"] == [memory, memory] and record["answer"] == "hello"
    assert [t["reply"] for t in record["turns"]] == [THOUGHT, THOUGHT, FINAL]
    assert [t["memory"] for t in record["turns"]] == [memory, memory, None]


def test_off_budgets_the_longer_template(qwen3):
    """The engine is sized for the prompt `off` renders: its empty think block's two tokens."""
    template = {t: MemAgent(_config(t), qwen3).turn_parts()["template"]
                for t in THINKING_CHOICES}
    assert template["off"] == template["keep"] + 2 == template["strip"] + 2


def test_a_model_that_never_thinks_reads_the_same_under_every_setting(word_tokenizer):
    """Qwen2.5's case: no enable_thinking in the template and no </think> in a reply."""
    read = {}
    for thinking in THINKING_CHOICES:
        agent, runner = on_engine(ScriptedEngine(word_tokenizer),
                                MemAgent(_config(thinking), word_tokenizer, (EOS,)))
        (trajectory,), = runner.run(agent, [agent.read(QUESTION, _document(3 * C))],
                                   SamplingParams(0.0))
        read[thinking] = ([(t.prompt_ids, t.response_ids, t.reply) for t in trajectory.turns],
                          memories_of(trajectory), trajectory.answer)
    assert read["keep"] == read["strip"] == read["off"]
    assert read["keep"][1] == ["hello world", "world the", "the answer"]


def test_strip_leaves_a_reply_whole_where_the_tokenizer_has_no_think_end(word_tokenizer):
    """Without a `</think>` token the tokenizer reads it with its unknown id (here `<`, unknown,
    `>`): a reply with an unknown word between those two is not the end of a thought."""
    agent, runner = on_engine(ScriptedEngine(word_tokenizer),
                            MemAgent(_config("strip"), word_tokenizer, (EOS,)))
    think_end = _ids(word_tokenizer, "</think>")
    assert word_tokenizer.convert_tokens_to_ids("[UNK]") in think_end
    reply = _ids(word_tokenizer, "hello world") + think_end + _ids(word_tokenizer, "memory hello")
    assert agent.memory_ids(reply) == reply


PIECES = ["<think>", "</think>", " ", "\n\n", "a", "b c", "x"]  # a vocabulary of 7 ids


def _text(ids):
    return "".join(PIECES[i] for i in ids)


def test_strip_is_one_rule_in_ids_and_in_text():
    """strip_thinking_ids (the engine) decodes to what strip_thinking_text (a server) gives for
    the reply's text: after the last </think>, whitespace stripped, empty when nothing follows
    (the original keeps no fallback there); without </think>, the whole reply as it is."""
    assert strip_thinking_text("<think> a </think>\n\n") == ""
    assert strip_thinking_text("a </think> b </think>\n\n x y \n") == "x y"
    assert strip_thinking_text(" x y \n") == " x y \n"
    assert strip_thinking_ids([0, 4, 1, 3], [1], lambda t: not PIECES[t].strip()) == []
    assert strip_thinking_ids([3, 4, 3], [1], lambda t: not PIECES[t].strip()) == [3, 4, 3]
    # `</think>` of several ids: the last whole occurrence
    assert strip_thinking_ids([8, 9, 4, 8, 9, 2, 6, 8, 2], [8, 9], lambda t: t == 2) == [6, 8]
    rng = random.Random(0)
    for _ in range(3000):
        ids = [rng.randrange(len(PIECES)) for _ in range(rng.randrange(12))]
        memory = strip_thinking_ids(ids, [1], lambda t: not PIECES[t].strip())
        assert _text(memory) == strip_thinking_text(_text(ids)), ids


def test_off_end_to_end_on_a_tiny_model(tmp_path):
    """A tiny random Qwen with the Qwen3-like tokenizer through `build_runner`: under off every
    prompt holds the empty think block (the first is keep's plus the block), the memories are
    the replies, and the loop answers from its final reply."""
    from memagent_jax.engine.engine_api import EngineConfig
    from memagent_jax.engine.factory import load_model_section
    from memagent_jax.engine.model_section import ModelSection
    from memagent_jax.rollout.runner import build_runner

    section = ModelSection(path=write_tiny_model(tmp_path / "m", seed=5, thinking=True))
    tokenizer = section.load_tokenizer(required=True)
    loaded = load_model_section(section, tokenizer)
    off = MemAgentConfig(chunk_tokens=16, max_memory_tokens=6, max_final_tokens=6,
                         max_problem_tokens=8, thinking="off")
    agent = MemAgent(off)
    runner = build_runner(agent, loaded.model, tokenizer, EngineConfig(slots=1), None,
                          loaded.stop_ids).with_params(loaded.params)
    sample = agent.read("what is the answer", _document(40))
    (trajectory,), = runner.run(agent, [sample], SamplingParams(0.0))
    turns = trajectory.turns
    assert [t.kind for t in turns] == ["update"] * 3 + ["final"]
    think_block = _ids(tokenizer, "<think> </think>")
    assert all(t.prompt_ids[-2:] == think_block for t in turns)
    assert turns[0].prompt_ids == chat_prompt_ids(tokenizer, update_prompt(
        "what is the answer", "No previous memory", tokenizer.decode(list(sample.chunks[0]))),
        "off")
    assert memories_of(trajectory) == [t.reply for t in turns[:-1]]
    assert trajectory.answer == final_answer(turns[-1].reply)

    keep = MemAgent(MemAgentConfig(**{**off.__dict__, "thinking": "keep"}), tokenizer,
                    loaded.stop_ids)
    (kept,), = runner.run(keep, [sample], SamplingParams(0.0))
    assert turns[0].prompt_ids == kept.turns[0].prompt_ids + think_block
    assert all(think_block[0] not in t.prompt_ids for t in kept.turns)


@pytest.mark.parametrize("command, config", [("eval", "eval/tiny_cpu.yaml"),
                                             ("train", "train/tiny_cpu.yaml")])
def test_a_bad_thinking_value_is_one_clear_line(command, config, capsys):
    code = main([command, "--config", str(CONFIGS / config), "memagent.thinking=maybe"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "memagent.thinking" in err[0] and "'maybe'" in err[0], err
    with pytest.raises(ConfigError, match="memagent.thinking: must be one of keep, strip, off, "
                                          "got 'maybe'"):
        MemAgentConfig(thinking="maybe")


def test_yaml_reads_a_bare_off_as_off(tmp_path):
    """YAML 1.1 reads `thinking: off` as false: the setting takes it as "off"."""
    from memagent_jax.eval.config import EvalConfig
    from memagent_jax.runconfig import load_config

    path = tmp_path / "c.yaml"
    path.write_text(f"base: {CONFIGS / 'eval' / 'tiny_cpu.yaml'}\nmemagent:\n  thinking: off\n")
    assert load_config(EvalConfig, str(path)).memagent.thinking == "off"
    base = str(CONFIGS / "eval" / "tiny_cpu.yaml")
    assert load_config(EvalConfig, base, ["memagent.thinking=off"]).memagent.thinking == "off"
    assert load_config(EvalConfig, base).memagent.thinking == "keep"
