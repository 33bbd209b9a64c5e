"""A tiny synthetic needle task in the training layout, with a word-level tokenizer for it.

For training runs that must finish on a CPU in minutes (configs/train/tiny_cpu.yaml, the
tests): each document is a few sentences of filler words with one needle sentence, "the secret
code is <word> .", at a random place; the question asks for the code; the ground truth is the
word.
Rows follow the layout of `BytedTsinghua-SIA/hotpotqa` (see data/pipeline.py) with data_source
"needle", so the trainer reads them exactly as it reads the real data set.

No Qwen tokenizer can be downloaded everywhere, so `write_tokenizer` writes a real `transformers`
fast tokenizer of words (data/word_tokenizer.py: what `AutoTokenizer` reads as we do) whose
vocabulary holds the MemAgent templates' words and this task's words, with a minimal chat
template; it fits the `tiny` preset's 512 embedding rows. Everything is deterministic by seed.

    memagent-jax data needle --out DIR   # DIR/train.parquet, val.parquet, tokenizer/
"""

from __future__ import annotations

import os
import random
import re

from memagent_jax.extras import needs
from memagent_jax.fileutil import atomic_directory

FILLER = ("the river runs past an old mill where farmers bring grain every autumn and the town "
          "keeps a small market near a stone bridge with bright lamps on long evenings while "
          "children play by the water and birds sing in tall green trees").split()
CODES = ("apple", "tiger", "violet", "copper", "falcon", "maple", "ocean", "granite", "lemon",
         "cobalt", "willow", "ember")
QUESTION = "what is the secret code ?"
NEEDLE = "the secret code is {code} ."


def needle_rows(count: int, seed: int = 0, sentences: tuple[int, int] = (3, 6),
                sentence_words: tuple[int, int] = (5, 9)) -> list[dict]:
    """count rows of the training layout; each document has a random number of filler
    sentences (inclusive range) plus the needle sentence at a random position."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        code = rng.choice(CODES)
        body = [" ".join(rng.choice(FILLER) for _ in range(rng.randint(*sentence_words))) + " ."
                for _ in range(rng.randint(*sentences))]
        body.insert(rng.randint(0, len(body)), NEEDLE.format(code=code))
        rows.append({
            "data_source": "needle",
            "prompt": [{"role": "user", "content": QUESTION}],
            "context": " ".join(body),
            "reward_model": {"ground_truth": [code], "style": "rule"},
            "extra_info": {"index": index, "question": QUESTION, "num_docs": 1},
        })
    return rows


def write_rows(rows: list[dict], path: str) -> str:
    """Writes rows as a parquet file (the published data set's format); returns the path."""
    with needs("data", "writing parquet files"):
        import pyarrow as pa
        import pyarrow.parquet as pq

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }} {{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant {% endif %}")
ROLES = ("user", "assistant")


def vocabulary(task_words: list[str] | None = None) -> list[str]:
    """Special tokens first (<pad>=0, <s>=1, </s>=2), then `}.` and the chat roles, then every
    word the templates and the answer format use, then a task's words (default: this needle
    task's), in a fixed order. `}.` is the final prompt's `\\boxed{}.`: id 3, where the
    word-level tokenizer `memagent-tiny` was trained with read it, as [UNK]."""
    from memagent_jax.agents.memagent.templates import (
        FINAL_TEMPLATE,
        INITIAL_MEMORY,
        UPDATE_TEMPLATE,
    )

    words = ["<pad>", "<s>", "</s>", "}.", *ROLES]
    text = " ".join([UPDATE_TEMPLATE, FINAL_TEMPLATE, INITIAL_MEMORY, "\\boxed{}",
                     *(task_words if task_words is not None else [QUESTION, NEEDLE, *FILLER,
                                                                  *CODES])])
    # Words, runs of punctuation, and `\\boxed{` whole: a reply's answer then decodes as
    # `\\boxed{ answer}`, which the original's extraction and its space-dropping comparison
    # read (split into `\\ boxed {` it would read as no answer at all).
    for word in re.findall(r"\\boxed\{|\w+|[^\w\s]+", text):
        if word not in words:
            words.append(word)
    return words


def write_tokenizer(out_dir: str, words: list[str] | None = None) -> str:
    """Saves the tokenizer of `words` (default: `vocabulary()`; tokenizer.json,
    tokenizer_config.json, chat_template.jinja; eos </s>) to out_dir (new or empty), all or
    nothing (`atomic_directory`)."""
    from memagent_jax.data.word_tokenizer import build, save
    with atomic_directory(out_dir) as tmp:
        save(build(words or vocabulary(), ROLES, CHAT_TEMPLATE), tmp)
    return out_dir


def write_task(out_dir: str, train_size: int = 64, val_size: int = 16, seed: int = 0,
               **row_options) -> dict[str, str]:
    """train.parquet, val.parquet (a different seed) and tokenizer/ under out_dir (new or
    empty), all or nothing."""
    names = {"train": "train.parquet", "val": "val.parquet", "tokenizer": "tokenizer"}
    with atomic_directory(out_dir) as tmp:
        write_rows(needle_rows(train_size, seed, **row_options),
                   os.path.join(tmp, names["train"]))
        write_rows(needle_rows(val_size, seed + 1_000_003, **row_options),
                   os.path.join(tmp, names["val"]))
        write_tokenizer(os.path.join(tmp, names["tokenizer"]))
    return {kind: os.path.join(out_dir, name) for kind, name in names.items()}
