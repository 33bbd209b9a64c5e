"""The tokenizer and stop tokens that belong to a model directory (HF or our checkpoint)."""

from __future__ import annotations

import json
import os

from memagent_jax import pretrained
from memagent_jax.models.checkpoint import side_files_dir
from memagent_jax.models.config import ModelConfig

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# Ids from here on are the bytes and merge steps of a word vocabulary's tokenizer
# (data/word_tokenizer.py): text outside the vocabulary, which no model has rows for.
PIECE_IDS = 1 << 20


def side_dirs(model_path: str) -> list[str]:
    """Where a model's tokenizer/generation files live: an HF dir, or a checkpoint's copy
    (`model_path` may be a shipped model's name)."""
    model_path = pretrained.resolve(model_path)
    return [model_path, side_files_dir(model_path)]


def load_tokenizer(model_path: str):
    """transformers' tokenizer for the model, or None when the directory has none.

    tokenizer.json is loaded as written (PreTrainedTokenizerFast). The tokenizers this project
    writes read the same through AutoTokenizer (data/word_tokenizer.py); a word-level
    tokenizer.json written before them reads right only this way.
    """
    for directory in side_dirs(model_path):
        if os.path.isfile(os.path.join(directory, "tokenizer.json")):
            from transformers import PreTrainedTokenizerFast  # heavy; only for text
            return PreTrainedTokenizerFast.from_pretrained(directory)
        if any(os.path.isfile(os.path.join(directory, f)) for f in _TOKENIZER_FILES):
            from transformers import AutoTokenizer
            return AutoTokenizer.from_pretrained(directory)
    return None


def rows_needed(tokenizer) -> int:
    """The embedding rows a model needs for the tokenizer's vocabulary: its largest id below
    `PIECE_IDS`, plus one."""
    return 1 + max(i for i in tokenizer.get_vocab().values() if i < PIECE_IDS)


def word_ids(tokenizer, words: list[str]) -> list[int]:
    """The id of each word, each read alone by the tokenizer as one token (a word tokenizer's
    words: data/word_tokenizer.py); ValueError naming a word that is not one token."""
    encoded = tokenizer(list(words), add_special_tokens=False)["input_ids"]
    for word, ids in zip(words, encoded):
        if len(ids) != 1:
            raise ValueError(f"'{word}' is not one token of this tokenizer ({ids})")
    return [ids[0] for ids in encoded]


def stop_token_ids(model_path: str, config: ModelConfig) -> tuple[int, ...]:
    """EOS ids from generation_config.json (Qwen2.5-Instruct lists <|im_end|> and
    <|endoftext|> there), else from config.json."""
    eos = config.extra.get("eos_token_id")
    for directory in side_dirs(model_path):
        path = os.path.join(directory, "generation_config.json")
        if os.path.isfile(path):
            with open(path) as f:
                eos = json.load(f).get("eos_token_id", eos)
            break
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)
