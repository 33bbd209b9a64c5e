"""The shipped agent, `memagent-tiny` (memagent_jax/pretrained; trained by the synthetic recipe,
docs/synthetic.md): addressed by name, a Qwen2 that `transformers` loads with our logits, and a
memory agent that answers fresh multikey documents of 8K tokens (a seed no training or
evaluation set of the recipe used), through docs/guides/run.md's own Python example."""

import os
import re

import pytest

from memagent_jax import model_dir
from memagent_jax.cli import main
from memagent_jax.models.loading import load_model, read_config
from memagent_jax.synthetic import tasks as synthetic
from memagent_jax.tokenizer import load_tokenizer, rows_needed, word_ids
from tests.hf_reference import assert_trained_export_matches_transformers

pytestmark = pytest.mark.slow  # the shipped model loaded in transformers and run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = "memagent-tiny"
FRESH_SEED = 424242  # the recipe's data: seeds 1, 3 and 5 train, 2 validates, 9-11 evaluate
DOCUMENTS = 16
# Correct answers of the 16: the shipped model answers 14 (and 97 % of multikey questions at
# 8K, 94 % of 256 fresh ones, docs/synthetic.md; the model shipped before it 15); the recipe's
# step-2 model, which does not yet copy from anywhere in its prompt, 0, as a random one; an
# agent that keeps the last fact it reads, one in four. Two below 14 leave room for the last
# bits of another CPU's arithmetic, not for a model that does not answer (12 of 16 by chance
# at one in four: 4e-5).
AT_LEAST = 12


def test_it_is_shipped_and_loads_in_transformers_with_our_logits():
    assert NAME in model_dir.shipped_names()
    assert_trained_export_matches_transformers(model_dir.resolve(NAME))


def test_the_python_api_takes_its_name_as_the_commands_do(monkeypatch):
    path = model_dir.resolve(NAME)
    _, config = load_model(NAME)
    assert config == read_config(NAME) == read_config(path)
    monkeypatch.setenv("HOME", os.path.dirname(path))
    assert read_config(f"~/{NAME}") == config  # as getting-started's load_model("~/ckpt/...")
    assert load_tokenizer(NAME).vocab == load_tokenizer(path).vocab
    assert model_dir.budgets(NAME) == model_dir.budgets(path) != {}


def test_vocab_lists_the_words_it_reads(capsys):
    """`vocab`: every word the model reads, one a line, each one token it has a row for; the
    words of a fresh document among them."""
    assert main(["vocab", "--model", NAME]) == 0
    words = capsys.readouterr().out.splitlines()
    tokenizer = load_tokenizer(NAME)
    assert len(words) == rows_needed(tokenizer) and "code" in words
    ids = word_ids(tokenizer, [w for w in words if w.isalpha()])
    assert max(ids) < read_config(NAME).vocab_size
    document = synthetic.make_sample("multikey", 2048, FRESH_SEED, 0)
    assert set(document.context.split()) <= set(words)


def _guide_python_example() -> str:
    """docs/guides/run.md's Python example of the memory agent (the block that calls
    build_runner)."""
    with open(os.path.join(ROOT, "docs", "guides", "run.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    (block,) = [b for b in blocks if "build_runner(" in b]
    return block


@pytest.mark.slow
def test_the_run_guides_python_example_answers_fresh_8k_multikey_documents_by_name():
    """The guide's example as written, with memagent-tiny for its model and fresh documents
    for its pairs."""
    code = _guide_python_example()
    assert code.count('"~/models/RL-MemoryAgent-14B"') == 1
    documents = [synthetic.make_sample("multikey", 8192, FRESH_SEED, i)
                 for i in range(DOCUMENTS)]
    scope = {"pairs": [(d.question, d.context) for d in documents]}
    exec(code.replace('"~/models/RL-MemoryAgent-14B"', repr(NAME)), scope)
    answers = [(trajectory.answer or "").strip() for (trajectory,) in scope["results"]]
    chunk_tokens = scope["budgets"].chunk_tokens
    assert chunk_tokens == model_dir.budgets(NAME)["chunk_tokens"]
    assert all(len(trajectory.turns) == 8192 // chunk_tokens + 1
               for (trajectory,) in scope["results"])
    correct = sum(a == d.answer for a, d in zip(answers, documents))
    assert correct >= AT_LEAST, list(zip(answers, [d.answer for d in documents]))
