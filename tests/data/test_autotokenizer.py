"""Every tokenizer the project writes reads through `transformers.AutoTokenizer` as the project
reads it (data/word_tokenizer.py): memagent-tiny's, `data needle`'s, `data synthetic`'s and
`random-model`'s, on the documents, questions and prompts of every task; where a model's
config.json (model_type qwen2) lies beside it, AutoTokenizer rebuilds it as Qwen2's tokenizer,
which the written one is; each names a tokenizer class transformers 4 loads too. An exported
training run is checked in tests/rl/test_trainer.py.

memagent-tiny's reading is also checked against the word-level tokenizer it was trained with
(rebuilt here as it was written: words, punctuation runs and `\\boxed{`, [UNK] for the rest)."""

import json
import re
import shutil

import pytest
from transformers import AutoTokenizer

from memagent_jax.agents.memagent import templates
from memagent_jax.cli import main
from memagent_jax.data import word_tokenizer
from memagent_jax.data.needle import needle_rows
from memagent_jax.model_dir import resolve
from memagent_jax.synthetic import tasks as synthetic
from memagent_jax.tokenizer import PIECE_IDS, load_tokenizer


def _texts(tasks=synthetic.TASKS, needle=True) -> list[str]:
    """Documents, questions, answers and both prompts (with a memory the model could write)."""
    texts = []
    samples = [synthetic.make_sample(task, 3000, seed=5, index=i)
               for task in tasks for i in range(2)]
    for s in samples:
        memory = f"the code of {s.answer} is \\boxed{{ {s.answer}}}"
        words = s.context.split(" ")
        texts += [s.context, s.question, s.answer,
                  templates.update_prompt(s.question, templates.INITIAL_MEMORY,
                                          " ".join(words[:200])),
                  templates.update_prompt(s.question, memory, " ".join(words[-200:])),
                  templates.final_prompt(s.question, memory)]
    if needle:
        for row in needle_rows(3, seed=2):
            question = row["prompt"][0]["content"]
            texts += [row["context"], question,
                      templates.final_prompt(question, templates.INITIAL_MEMORY)]
    return texts


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _same_reading(directory, texts):
    # `ours` reads tokenizer.json as written, as transformers 4 reads it under the class the
    # config names (4 has no `TokenizersBackend`, the name transformers 5 writes).
    with open(f"{directory}/tokenizer_config.json") as f:
        assert json.load(f)["tokenizer_class"] == "PreTrainedTokenizerFast"
    ours, theirs = load_tokenizer(directory), AutoTokenizer.from_pretrained(directory)
    for text in texts:
        ids = _ids(ours, text)
        assert _ids(theirs, text) == ids, text[:200]
        assert max(ids) < PIECE_IDS, text[:200]   # every word is in the vocabulary
        # The original's evaluation cuts documents into chunks of ids and decodes them
        # with AutoTokenizer; what our server reads back must be those ids. (Punctuation
        # decodes with no space before it, so two runs that make a third, "}" and "." of
        # "}.", would not: as with the word-level tokenizer, whose decoding joined them too.)
        for start in range(0, len(ids), 97):
            assert _ids(ours, theirs.decode(ids[start:start + 97])) == ids[start:start + 97]
    messages = [{"role": "user", "content": texts[-1]}]
    assert (theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            == ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    assert (_ids(theirs, ours.apply_chat_template(messages, add_generation_prompt=True,
                                                  tokenize=False))
            == ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=False))
    return theirs


def _beside_a_model(tokenizer_dir, tmp_path):
    """The tokenizer as a model trained on it carries it: next to a qwen2 config.json."""
    model_dir = tmp_path / "as_model"
    shutil.copytree(tokenizer_dir, model_dir)
    shutil.copy(f"{resolve('memagent-tiny')}/config.json", model_dir)
    return str(model_dir)


def _word_level_reading(words: list[str], text: str) -> list[int]:
    """The word-level tokenizer memagent-tiny was trained with, as it was written."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)},
                                           unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"\\boxed\{|\w+|[^\w\s]+"),
                                                   behavior="removed", invert=True)
    tokenizer.add_special_tokens(["<pad>", "<s>", "</s>", "[UNK]"])
    return tokenizer.encode(text).ids


def test_memagent_tiny_reads_the_same_through_autotokenizer_and_as_it_was_trained():
    directory = resolve("memagent-tiny")
    texts = _texts(needle=False)
    _same_reading(directory, texts)
    with open(f"{directory}/tokenizer.json") as f:
        vocab = json.load(f)["model"]["vocab"]
    words = [w for w, _ in sorted(vocab.items(), key=lambda item: item[1])][:3969]
    words = [w.removeprefix("Ġ") for w in words]
    assert words[3] == "}."
    words[3] = "[UNK]"   # the word-level tokenizer's unknown token, at the id it trained on
    ours = load_tokenizer(directory)
    for text in texts:
        assert _ids(ours, text) == _word_level_reading(words, text), text[:200]


@pytest.mark.slow
def test_data_needle_and_random_model_tokenizers_read_the_same(tmp_path):
    assert main(["data", "needle", "--out", str(tmp_path / "needle"), "--train-size", "2",
                 "--val-size", "1"]) == 0
    texts = _texts(tasks=(), needle=True)
    tokenizer_dir = str(tmp_path / "needle" / "tokenizer")
    _same_reading(tokenizer_dir, texts)
    theirs = _same_reading(_beside_a_model(tokenizer_dir, tmp_path), texts)
    assert type(theirs).__name__ == "Qwen2Tokenizer"   # the class transformers picks there

    assert main(["random-model", "--preset", "tiny", "--out", str(tmp_path / "random")]) == 0
    _same_reading(str(tmp_path / "random"), texts)


def test_data_synthetic_tokenizer_reads_the_same(tmp_path):
    out = tmp_path / "synthetic"
    assert main(["data", "synthetic", "--task", "multikey", "--lengths", "512",
                 "--num-samples", "1", "--out", str(out)]) == 0
    texts = _texts(needle=False)
    _same_reading(str(out / "tokenizer"), texts)
    _same_reading(_beside_a_model(str(out / "tokenizer"), tmp_path), texts)


def test_text_outside_the_vocabulary_reads_as_ids_no_model_has():
    """Not as nothing (a byte-level BPE without an unknown token drops bytes it lacks) and not
    as a known word."""
    tokenizer = load_tokenizer(resolve("memagent-tiny"))
    ids = _ids(tokenizer, "the code of Zürich 42 is x_y .")
    known = [i for i in ids if i < PIECE_IDS]
    assert known == _ids(tokenizer, "the code of is .") and len(ids) > len(known) + 5
    decoded = tokenizer.decode(_ids(tokenizer, "the code of Zürich 42 is x_y ."))
    assert decoded.split() == "the code of Zürich 4 2 is x _y.".split()


@pytest.mark.parametrize("text", ["the code of zakolo is\n\nzakolo .", "what is  the code ?"])
def test_whitespace_between_words_that_is_not_one_space_is_one_piece(text):
    """The one place the reading differs from a word-level tokenizer's (module docstring)."""
    ids = _ids(load_tokenizer(resolve("memagent-tiny")), text)
    assert sum(i >= PIECE_IDS for i in ids) == 1


@pytest.mark.parametrize("text,named", [
    ("what is the code of Zürich 42 ?", "'Zürich', '42'"),
    # whitespace between or after words it reads: the whitespace, not the words, and where
    ("what is the code\nof zakolo ?", "'\\n' between 'code' and 'of'"),
    ("what is  the code ?", "'  ' between 'is' and 'the'"),
    ("what is the code of zakolo ", "' ' after 'zakolo' at the end"),
    ("what is the  zebra ?", "'zebra'"),  # a word it cannot read: the word alone
])
def test_what_the_vocabulary_cannot_read_is_refused_by_name(text, named):
    """(tokenizer.check_representable: `run`'s question and document, `generate`'s prompts)"""
    from memagent_jax.errors import UserError
    from memagent_jax.tokenizer import check_representable

    tokenizer = load_tokenizer(resolve("memagent-tiny"))
    check_representable(tokenizer, "what is the code of zakolo ?", "--question")
    with pytest.raises(UserError, match=re.escape(
            f"--question: the tokenizer has no token for {named} (it reads them as pieces no "
            "model has rows for; `memagent-jax vocab --model MODEL` lists the words a model "
            "reads)")):
        check_representable(tokenizer, text, "--question")


@pytest.mark.parametrize("whitespace, space", [
    *((w, True) for w in ["\n", "\r", "\r\n", "\n\n", " \n", "  ", "\t\t", "\n\t"]),
    # Qwen's split regex joins one non-letter but \r, \n to the word after it ("\tcode").
    *((w, False) for w in ["\t", "\x0b", "\x0c"]),
])
def test_a_built_tokenizer_reads_whitespace_between_words_as_at_most_one_piece(whitespace,
                                                                                space):
    """word_tokenizer.build: a whitespace byte other than the space is never read as a piece
    of its own; a line break or two whitespace characters between two words read as the one
    piece `Ġ` (an id from PIECE_IDS on), a single tab before a word as nothing."""
    tokenizer = word_tokenizer.build(["<pad>", "<s>", "</s>", "the", "code", "is", "."],
                                     roles=("user",), chat_template="")
    piece = tokenizer.convert_tokens_to_ids("Ġ")
    assert piece >= PIECE_IDS
    assert _ids(tokenizer, "the code is .") == [3, 4, 5, 6]
    assert _ids(tokenizer, f"the{whitespace}code is .") == [3, *[piece] * space, 4, 5, 6]
