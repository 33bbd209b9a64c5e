"""The lookup task: rows whose answer only a tool call gives.

A row asks for the code of a key ("what is the code of KEY ?", in one of three phrasings). Its
table (the asked key and three others, each with a code) is the `lookup` tool's (tools.py),
handed to it through the row's `extra_info.tools_kwargs` (verl's field), and never shown to the
model: the answer is the code the tool returns for the asked key, in `\\boxed{}`. Keys and codes
are made-up words, drawn per row, so no code can be learned by heart.

`write_task` writes a seed's rows in verl's layout (`train.parquet`: what `train` reads) or as
an eval set (`eval_lookup.json`: `input`, `answers`, `extra_info`), and the word-level tokenizer
of the vocabulary (every word and punctuation run one token; data/word_tokenizer.py) with a chat
template that renders system, user, assistant and tool messages (tool results as a user turn of
`<tool_response>`, as the original's Qwen template does; whitespace runs as one space).
Deterministic by seed.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import re

from memagent_jax.fileutil import atomic_directory

PHRASINGS = ("what is the code of {key} ?", "which code does {key} have ?",
             "tell me the code for {key} .")
TABLE_SIZE = 4
DATA_SOURCE = "lookup"
ROLES = ("system", "user", "assistant")
# Whitespace runs become one space: a word-level reading has no token for a line break
# between two words.
CHAT_TEMPLATE = (
    "{% for m in messages %}{% set text = m['content'].split() | join(' ') %}"
    "{% if m['role'] == 'tool' %}<s>user <tool_response> {{ text }} </tool_response></s>"
    "{% else %}<s>{{ m['role'] }} {{ text }}</s>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant {% endif %}")
# A word-level reading: whole markup tags, `\\boxed{`, words, punctuation runs.
_PIECES = re.compile(r"</?tool_call>|</?tool_response>|\\boxed\{|\w+|[^\w\s]+")


@functools.lru_cache(maxsize=1)
def words() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(keys, codes): 120 made-up words each, disjoint, the same on every call."""
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    three = ["".join(p) for p in itertools.product(syllables, repeat=3)]
    chosen = random.Random(0).sample(three, 240)
    return tuple(chosen[:120]), tuple(chosen[120:])


def make_row(seed: int, index: int) -> dict:
    """Row `index` of seed `seed`, in verl's layout (module docstring)."""
    keys, codes = words()
    rng = random.Random(f"lookup/{seed}/{index}")
    table = list(zip(rng.sample(keys, TABLE_SIZE), rng.sample(codes, TABLE_SIZE)))
    key, code = table[rng.randrange(TABLE_SIZE)]
    question = rng.choice(PHRASINGS).format(key=key)
    return {"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": question}],
            "reward_model": {"ground_truth": [code], "style": "rule"},
            "extra_info": {"index": index,
                           "tools_kwargs": {"lookup": {"create_kwargs": {
                               "table": [list(pair) for pair in table]}}}}}


def vocabulary() -> list[str]:
    """<pad>, <s>, </s>, the roles, then every piece of the tools' system prompt, the
    phrasings, the tool's replies, the answer format and the keys and codes."""
    from memagent_jax.agents import tool_calling
    from memagent_jax.lookup.tools import TOOL
    from memagent_jax.rollout import tool_calls

    keys, codes = words()
    vocab = ["<pad>", "<s>", "</s>", *ROLES]
    errors = [tool_calls.INVALID_JSON, tool_calls.NO_NAME, tool_calling.UNKNOWN_TOOL,
              tool_calls.NOT_AN_OBJECT, "error: lookup takes key (required: key)"]
    text = " ".join([tool_calls.declare_tools([TOOL.declaration]), *PHRASINGS,
                     "the code of is . no such key .",
                     *errors,
                     "<tool_call> </tool_call> <tool_response> </tool_response>",
                     '{"name": "lookup", "arguments": {"key": "k"}}', "\\boxed{ x }",
                     *keys, *codes])
    for piece in _PIECES.findall(text.replace("{key}", "k")):
        if piece not in vocab:
            vocab.append(piece)
    return vocab


def write_tokenizer(out_dir: str) -> str:
    from memagent_jax.data.word_tokenizer import build, save
    save(build(vocabulary(), ROLES, CHAT_TEMPLATE), out_dir)
    return out_dir


def output_path(out_dir: str, layout: str) -> str:
    """The file `write_task` writes."""
    return os.path.join(out_dir, "train.parquet" if layout == "train" else "eval_lookup.json")


def write_task(out_dir: str, seed: int, count: int, layout: str) -> str:
    """`count` rows of `seed` under out_dir (module docstring: `output_path`), each file written
    whole or not at all, and tokenizer/ beside them unless it is there; the file's path."""
    from memagent_jax.data.io import write_parquet, write_set

    rows = [make_row(seed, i) for i in range(count)]
    tokenizer = os.path.join(out_dir, "tokenizer")
    if not os.path.isdir(tokenizer):
        with atomic_directory(tokenizer) as tmp:
            write_tokenizer(tmp)
    path = output_path(out_dir, layout)
    if layout == "train":
        write_parquet(path, rows)
    else:
        write_set(path, ({"input": r["prompt"][0]["content"],
                          "answers": r["reward_model"]["ground_truth"],
                          "data_source": DATA_SOURCE, "extra_info": r["extra_info"], "index": i}
                         for i, r in enumerate(rows)))
    return path
