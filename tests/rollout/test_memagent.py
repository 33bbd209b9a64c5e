"""The MemAgent loop: exact templates, chunking, memory hand-over, group mode, engine runs."""

import dataclasses
import math

import pytest

from memagent_jax.agents.memagent.agent import MemAgent, memories_of
from memagent_jax.agents.memagent.config import MemAgentConfig
from memagent_jax.agents.memagent.reading import Sample, chunk_ids, read_sample
from memagent_jax.agents.memagent.templates import (
    FINAL_TEMPLATE,
    UPDATE_TEMPLATE,
    TokenPrompts,
    final_prompt,
    update_prompt,
)
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.errors import UserError
from memagent_jax.model_dir import resolve
from memagent_jax.models.loading import load_model
from memagent_jax.models.qwen import split_params
from memagent_jax.rollout.chat import chat_prompt_ids
from memagent_jax.rollout.runner import build_runner
from memagent_jax.tokenizer import load_tokenizer
from tests.builders import EOS, ScriptedEngine, on_engine
from tests.hf_reference import write_hf_model

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
C = 7


def test_templates_are_byte_exact():
    """Against the text of docs/algorithm.md and the original's own strings (its final
    template reads \\boxed{{}} unformatted in its trainer; ours, as its evaluation, \\boxed{})."""
    from tests import original_memory_prompts as original

    assert update_prompt("P", "M", "C") == UPDATE_TEXT
    assert final_prompt("P", "M") == FINAL_TEXT
    assert UPDATE_TEMPLATE.replace("{problem}", "{prompt}") == original.TEMPLATE
    assert FINAL_TEMPLATE.replace("{problem}", "{prompt}") == original.TEMPLATE_FINAL_BOXED
    assert final_prompt("{prompt}", "{memory}") == original.TEMPLATE_FINAL_BOXED.replace(
        "{{}}", "{}")


def _document(tokenizer, n):
    words = ["hello", "world", "the", "answer", "is", "memory"]
    return " ".join(words[i % len(words)] for i in range(n))


@pytest.mark.parametrize("length", [1, C - 1, C, C + 1, 10 * C])
def test_conversations_are_exactly_the_originals(word_tokenizer, length):
    engine = ScriptedEngine(word_tokenizer)
    agent, runner = on_engine(engine, MemAgent(
        MemAgentConfig(chunk_tokens=C, max_memory_tokens=8, max_final_tokens=8,
                       max_problem_tokens=16), word_tokenizer, stop_ids=(EOS,)))
    document = _document(word_tokenizer, length)
    (trajectory,), = runner.run(agent, [agent.read("what is it", document)], SamplingParams(0.0))
    turns = trajectory.turns
    assert len(turns) == math.ceil(length / C) + 1
    ids = word_tokenizer(document, add_special_tokens=False)["input_ids"]
    memory = "No previous memory"
    for k, turn in enumerate(turns[:-1]):
        chunk = word_tokenizer.decode(ids[k * C:(k + 1) * C])
        assert turn.kind == "update"
        assert turn.prompt_ids == chat_prompt_ids(
            word_tokenizer, update_prompt("what is it", memory, chunk))
        memory = " ".join(chunk.split()[:2])
        assert turn.reply == memory and turn.finish_reason == "stop"
    assert turns[-1].kind == "final"
    assert turns[-1].prompt_ids == chat_prompt_ids(word_tokenizer,
                                                   final_prompt("what is it", memory))
    assert memories_of(trajectory) == [t.reply for t in turns[:-1]]


def test_a_sample_can_start_from_a_memory_of_its_own(word_tokenizer):
    """A rollout that starts inside a document (a carry start, synthetic/carry_starts.py): the first
       prompt is the
    original's update prompt with the given memory in place of "No previous memory"."""
    agent, runner = on_engine(ScriptedEngine(word_tokenizer), MemAgent(
        MemAgentConfig(chunk_tokens=C, max_memory_tokens=8, max_final_tokens=8,
                       max_problem_tokens=16), word_tokenizer, stop_ids=(EOS,)))
    sample = agent.read("what is it", _document(word_tokenizer, 2 * C))
    memory = tuple(word_tokenizer("the answer is memory", add_special_tokens=False)["input_ids"])
    started = dataclasses.replace(sample, initial_memory=memory)
    (trajectory,), = runner.run(agent, [started], SamplingParams(0.0))
    chunk = word_tokenizer.decode(list(sample.chunks[0]))
    assert trajectory.turns[0].prompt_ids == chat_prompt_ids(
        word_tokenizer, update_prompt("what is it", "the answer is memory", chunk))
    (plain,), = runner.run(agent, [sample], SamplingParams(0.0))
    assert plain.turns[0].prompt_ids == chat_prompt_ids(
        word_tokenizer, update_prompt("what is it", "No previous memory", chunk))
    assert [t.prompt_ids for t in trajectory.turns[1:]] == [t.prompt_ids for t in plain.turns[1:]]


def test_a_reply_cut_at_the_cap_is_kept_as_is(word_tokenizer):
    engine = ScriptedEngine(word_tokenizer, repeat=10)  # 20 words, cap 5
    agent, runner = on_engine(engine, MemAgent(
        MemAgentConfig(chunk_tokens=C, max_memory_tokens=5, max_final_tokens=5,
                       max_problem_tokens=16), word_tokenizer, stop_ids=(EOS,)))
    (trajectory,), = runner.run(agent, [agent.read("q", _document(word_tokenizer, 2 * C))],
                               SamplingParams(0.0))
    first, second = trajectory.turns[:2]
    assert first.finish_reason == "length" and len(first.response_ids) == 5
    assert first.reply == "hello world hello world hello"
    # word-level decoding puts spaces between the template's pieces
    assert "< memory > hello world hello world hello </ memory >" in word_tokenizer.decode(
        second.prompt_ids)


def test_group_mode_prefills_the_shared_first_turn_once(word_tokenizer):
    engine = ScriptedEngine(word_tokenizer, slots=3)
    agent, runner = on_engine(engine, MemAgent(
        MemAgentConfig(chunk_tokens=C, max_memory_tokens=8, max_final_tokens=8,
                       max_problem_tokens=16), word_tokenizer, stop_ids=(EOS,)))
    documents = [agent.read("q", _document(word_tokenizer, 3 * C)),
                 agent.read("q", _document(word_tokenizer, C))]
    results = runner.run(agent, documents, SamplingParams(1.0), n=4)
    assert [len(group) for group in results] == [4, 4]
    assert [len(t.turns) for t in results[0]] == [4] * 4
    # turns: sample 0 has 4 per trajectory, sample 1 has 2; the first turns are shared
    assert engine.prefill_count == (1 + 4 * 3) + (1 + 4 * 1)


def test_chunking_centre_truncates_the_tokens_then_cuts_chunks():
    """As verl's postprocess_data(truncation='center') then the original's chunking: a
    41,000-token document with 8 chunks of 5,000 keeps its first and last 20,000 tokens (40,000;
    dropping whole chunks kept 36,000), then cuts 8 full chunks."""
    ids = list(range(41_000))
    chunks = chunk_ids(ids, 5000, max_chunks=8)
    assert [len(c) for c in chunks] == [5000] * 8
    assert sum(chunks, []) == ids[:20_000] + ids[21_000:]
    assert chunk_ids(ids[:25], 10) == [ids[0:10], ids[10:20], ids[20:25]]
    assert chunk_ids(ids[:45], 10, max_chunks=3) == [ids[:10], ids[10:15] + ids[30:35],
                                                       ids[35:45]]  # 30 kept: 15 + 15


def test_a_server_is_sent_each_chunk_as_the_documents_text():
    """What `run --url` sends: each chunk's span of the document, which reads back as the
    chunk's ids (memagent-tiny decodes "mona user" as "monauser", which reads as other ids);
    contiguous chunks join into the document, and a centre-truncated chunk is its two spans."""
    tiny = load_tokenizer(resolve("memagent-tiny"))
    document = "mona user is assistant } . code}.\nthe mona"
    config = MemAgentConfig(chunk_tokens=3, max_memory_tokens=8, max_final_tokens=8,
                            max_problem_tokens=8)

    def reads(text):
        return tuple(tiny(text, add_special_tokens=False)["input_ids"])

    sample = read_sample(tiny, "q", document, config, strict=False)
    assert sample.chunk_texts == ("mona user is", " assistant } . ", "code}.\nthe", " mona")
    assert reads(tiny.decode(sample.chunks[0])) != sample.chunks[0]  # " monauser is"
    assert "".join(sample.chunk_texts) == document
    assert [reads(t) for t in sample.chunk_texts] == list(sample.chunks)
    cut = read_sample(tiny, "q", document, dataclasses.replace(config, max_chunks=2),
                      strict=False)
    assert cut.chunk_texts == ("mona user is", "}.\nthe mona")
    assert [reads(t) for t in cut.chunk_texts] == list(cut.chunks)


@pytest.mark.slow
def test_documents_up_to_200k_tokens_on_a_real_model_without_recompiling(tmp_path,
                                                                          word_tokenizer,
                                                                          compilations):
    # A window that holds the turns (build_engine refuses a cache beyond it)
    path = write_hf_model(tmp_path / "m", seed=13, max_position_embeddings=4096)
    model, _ = load_model(path)
    params = split_params(model)[1]
    config = MemAgentConfig(chunk_tokens=2000, max_memory_tokens=6, max_final_tokens=6,
                            max_problem_tokens=8)
    agent = MemAgent(config)
    runner = build_runner(agent, model, word_tokenizer,
                          EngineConfig(slots=4, max_len=2048 + 192, prefill_buckets=(64,)),
                          None, stop_ids=(EOS,))
    runner.scheduler.engine.warm_up(params)
    lengths = [200_000, 9_000, 100, 30_000, 2_000]
    samples = [agent.read("what is the answer", _document(word_tokenizer, n)) for n in lengths]
    with compilations() as counter:
        results = runner.with_params(params).run(agent, samples, SamplingParams(1.0, top_p=0.9))
    assert counter.count == 0
    for n, (trajectory,) in zip(lengths, results):
        assert len(trajectory.turns) == math.ceil(n / 2000) + 1
        assert all(len(c.response_ids) <= 6 for c in trajectory.turns)
        assert all(len(c.response_logprobs) == len(c.response_ids) for c in trajectory.turns)
    assert dataclasses.asdict(results[0][0])["problem"] == "what is the answer"


# ---- prompts in token ids, as the original's trainer builds them --------------------------

CHATML = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are Qwen, created by "
          "Alibaba Cloud. You are a helpful assistant.<|im_end|>\n{% endif %}"
          "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MULTILINGUAL = ("Le café de Zoë est près du musée. 東京の美術館は月曜日に休みです。"
                "Die Brücke über den Fluß ist schön. 🙂 naïve résumé façade — ")


@pytest.fixture(scope="module")
def bpe_tokenizer(tmp_path_factory):
    """A byte-level BPE (Qwen's kind) trained here on the templates and multilingual text, with
    Qwen's special tokens and a ChatML chat template with its default system prompt."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, show_progress=False,
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([UPDATE_TEMPLATE, FINAL_TEMPLATE, MULTILINGUAL * 3], trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>",
                                      pad_token="<|endoftext|>")
    wrapped.chat_template = CHATML
    wrapped.save_pretrained(str(tmp_path_factory.mktemp("bpe")))
    return wrapped


class FixedReplyEngine(ScriptedEngine):
    """Replies `reply` (ids) then EOS, to every prompt."""

    def __init__(self, tokenizer, reply):
        super().__init__(tokenizer)
        self.reply = list(reply)

    def _script(self, prompt_ids):
        return self.reply + [self.tokenizer.eos_token_id]


def test_prompts_splice_ids_as_the_original_trainer(bpe_tokenizer):
    """Chunks of 7 byte-level tokens cut inside words and inside multi-byte characters. Every
    turn's prompt is exactly what the original's TokenTemplate builds from the chat-wrapped
    template, the question's ids, the memory (the previous reply's ids through its `unpad`) and
    the chunk's ids; each chunk reaches its prompt verbatim. Decoding the chunks and
    re-tokenizing whole messages (what this port did before) gives other ids."""
    import torch

    from tests import original_memory_prompts as original

    tok, question = bpe_tokenizer, "Où est le café de Zoë ?"
    # Characters the tokenizer never saw are single bytes: chunks cut through them.
    document = MULTILINGUAL + "北京大学の図書館 𝔘𝔫𝔦 ✓ Ærøskøbing " * 2
    reply = tok.encode("Zoë: 東京 🙂", add_special_tokens=False)
    agent, runner = on_engine(FixedReplyEngine(tok, reply), MemAgent(
        MemAgentConfig(chunk_tokens=7, max_memory_tokens=16, max_final_tokens=16,
                       max_problem_tokens=32), tok, stop_ids=(tok.eos_token_id,)))
    (trajectory,), = runner.run(agent, [agent.read(question, document)], SamplingParams(0.0))

    chat = original.chat_template(tok)
    update = original.TokenTemplate(chat.format(message=original.TEMPLATE), tok)
    # Ours asks for \boxed{} where the original's trainer wrote \boxed{{}} (section 7).
    final = original.TokenTemplate(
        chat.format(message=original.TEMPLATE_FINAL_BOXED.replace("{{}}", "{}")), tok)
    no_memory = tok.encode("No previous memory", add_special_tokens=False)
    prompt = tok.encode(question, add_special_tokens=False)
    context = tok(document, add_special_tokens=False)["input_ids"]
    chunks = [context[i:i + 7] for i in range(0, len(context), 7)]
    assert len(trajectory.turns) == len(chunks) + 1

    memory, mangled = no_memory, 0
    for chunk, turn in zip(chunks, trajectory.turns):
        expected = update.format(prompt=prompt, memory=memory, chunk=chunk).tolist()
        assert turn.kind == "update" and turn.prompt_ids == expected
        at = len(expected) - len(update.last_section) - len(chunk)
        assert turn.prompt_ids[at:at + len(chunk)] == chunk
        retokenized = chat_prompt_ids(tok, update_prompt(
            question, tok.decode(memory), tok.decode(chunk)))
        mangled += retokenized != expected
        memory = original.unpad(tok, torch.tensor(turn.response_ids), remove_eos=True)[0]
        memory = memory.tolist()
        assert memory == reply and turn.reply == tok.decode(reply)
    assert trajectory.turns[-1].prompt_ids == final.format(prompt=prompt,
                                                           memory=memory).tolist()
    assert any("\ufffd" in tok.decode(c) for c in chunks)  # cuts inside characters
    assert mangled > len(chunks) // 2


def test_the_longest_turn_fits_the_engine_need(bpe_tokenizer):
    """The engine's need is exactly a full update prompt (longest question, memory and chunk)
    plus the longest reply; the final prompt is shorter. For one sample, its question and its
    longest chunk stand for the budgets', and the largest budget left is the one named."""
    config = MemAgentConfig(chunk_tokens=50, max_memory_tokens=20, max_final_tokens=30,
                            max_problem_tokens=10)
    prompts = TokenPrompts(bpe_tokenizer)
    longest = prompts.update([5] * 10, [6] * 20, [7] * 50)
    agent = MemAgent(config, bpe_tokenizer)
    tokens, key, why = agent.engine_need(bpe_tokenizer)
    assert (tokens, key) == (len(longest) + 30, "memagent.chunk_tokens")
    assert why.startswith(f"50 makes turns of up to {tokens} tokens (template ")
    assert len(prompts.final([5] * 10, [6] * 20)) < len(longest)
    sample = Sample("q", (5,) * 4, ((7,) * 12, (7,) * 3), 15)
    tokens, key, why = agent.engine_need(bpe_tokenizer, sample)
    assert tokens == len(prompts.update([5] * 4, [6] * 20, [7] * 12)) + 30
    assert key == "memagent.max_final_tokens" and why.startswith("30 makes turns")
    assert why.endswith("question 4 + memory 20 + chunk 12 + reply 30)")


def test_an_agent_builds_its_token_prompts_once(word_tokenizer, monkeypatch):
    """The chat-wrapped templates are tokenized once an agent (`setup`): the engine is sized
    from the same prompts the turns are spliced into."""
    from memagent_jax.agents.memagent import agent as memagent
    from memagent_jax.models.config import ModelConfig
    from memagent_jax.models.loading import random_model

    built = []

    class Counted(memagent.TokenPrompts):
        def __init__(self, *args, **kwargs):
            built.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(memagent, "TokenPrompts", Counted)
    model = random_model(ModelConfig(vocab_size=101, hidden_size=32, intermediate_size=48,
                                     num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
                                     max_position_embeddings=4096))
    config = MemAgentConfig(chunk_tokens=C, max_memory_tokens=8, max_final_tokens=8,
                            max_problem_tokens=16)
    build_runner(MemAgent(config), model, word_tokenizer, EngineConfig(slots=1), None, (EOS,))
    assert len(built) == 1


def test_training_reads_carry_on_where_a_users_read_stops(word_tokenizer):
    """strict (run, eval): one clear error for an empty document or an over-long question.
    Training (strict=False), as the original: an empty document is answered from the initial
    memory in one final turn; an over-long question keeps its first max_problem_tokens."""
    config = MemAgentConfig(chunk_tokens=C, max_memory_tokens=8, max_final_tokens=8,
                            max_problem_tokens=3)
    with pytest.raises(UserError, match="the document is empty"):
        read_sample(word_tokenizer, "q", "  ", config)
    with pytest.raises(UserError, match="the question has 4 tokens, over the prompt budget of 3"):
        read_sample(word_tokenizer, "what is the answer", "hello world", config)
    long_question = read_sample(word_tokenizer, "what is the answer", "hello world", config,
                                strict=False)
    assert long_question.problem_ids == tuple(word_tokenizer(
        "what is the", add_special_tokens=False)["input_ids"])
    empty = read_sample(word_tokenizer, "q", "", config, strict=False)
    assert empty.chunks == ()
    agent, runner = on_engine(ScriptedEngine(word_tokenizer), MemAgent(config, word_tokenizer,
                                                                        (EOS,)))
    (trajectory,), = runner.run(agent, [empty], SamplingParams(0.0))
    assert [t.kind for t in trajectory.turns] == ["final"]
    assert "< memory > No previous memory </ memory >" in word_tokenizer.decode(
        trajectory.turns[0].prompt_ids)
