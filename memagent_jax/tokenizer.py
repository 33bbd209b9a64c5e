"""The tokenizer and stop tokens that belong to a model directory (HF or our checkpoint), and
what a tokenizer cannot represent: text it reads as its unknown token, ids it has no token for."""

from __future__ import annotations

import json
import os

from memagent_jax.errors import UserError
from memagent_jax.model_dir import side_dirs

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# Ids from here on are the bytes and merge steps of a word vocabulary's tokenizer
# (data/word_tokenizer.py): text outside the vocabulary, which no model has rows for.
PIECE_IDS = 1 << 20


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


def stop_token_ids(model_path: str, config_eos=None) -> tuple[int, ...]:
    """EOS ids from generation_config.json (Qwen2.5-Instruct lists <|im_end|> and
    <|endoftext|> there), else `config_eos` (config.json's eos_token_id: an id or a list)."""
    eos = config_eos
    for directory in side_dirs(model_path):
        path = os.path.join(directory, "generation_config.json")
        if os.path.isfile(path):
            with open(path) as f:
                eos = json.load(f).get("eos_token_id", eos)
            break
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def unknown_id(tokenizer) -> int | None:
    """The id `tokenizer` reads text it cannot represent as: its unk_token's, else its
    vocabulary model's (a word-level model's [UNK] need not be declared to transformers);
    None where there is none (a byte-level BPE represents any text)."""
    if tokenizer.unk_token_id is not None:
        return tokenizer.unk_token_id
    backend = getattr(tokenizer, "backend_tokenizer", None)
    token = getattr(getattr(backend, "model", None), "unk_token", None)
    return backend.token_to_id(token) if token else None


def unknown_words(tokenizer, text: str) -> list[str]:
    """The distinct words of `text` (whitespace-delimited) that `tokenizer` reads as its
    unknown token (`unknown_id`) or as pieces from `PIECE_IDS` on (a word tokenizer's bytes:
    data/word_tokenizer.py), in order of first appearance; where every word reads but the
    whitespace between two does not (a word tokenizer's line break), those two words."""
    unk = unknown_id(tokenizer)

    def unreadable(ids) -> list[int]:
        return [k for k, i in enumerate(ids) if i == unk or i >= PIECE_IDS]

    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    pieces = [encoded["offset_mapping"][k] for k in unreadable(encoded["input_ids"])]
    if not pieces:
        return []
    words = list(dict.fromkeys(text.split()))
    found = [w for w, ids in zip(words, tokenizer(words, add_special_tokens=False)["input_ids"])
             if unreadable(ids)]
    return found or list(dict.fromkeys(_words_around(text, *span) for span in pieces))


def _words_around(text: str, start: int, end: int) -> str:
    while end < len(text) and text[end].isspace():
        end += 1
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    while end < len(text) and not text[end].isspace():
        end += 1
    return text[start:end]


def check_representable(tokenizer, text: str, what: str) -> None:
    """UserError naming `what` and the words of `text` the tokenizer cannot represent (the
    model would read its unknown token in their place, or ids it has no rows for)."""
    words = unknown_words(tokenizer, text)
    if words:
        shown = ", ".join(repr(w) for w in words[:5])
        more = f" and {len(words) - 5} more" if len(words) > 5 else ""
        unk = unknown_id(tokenizer)
        reads = (f"the model would read {tokenizer.convert_ids_to_tokens(unk)} in their place"
                 if unk is not None else "it reads them as pieces no model has rows for")
        raise UserError(f"{what}: the tokenizer has no token for {shown}{more} ({reads}; "
                        "`memagent-jax vocab --model MODEL` lists the words a model reads)")


def undecodable_ids(tokenizer, ids) -> list[int]:
    """The distinct ids of `ids` the tokenizer has no token for (past its vocabulary: they
    decode to nothing), in order of first appearance."""
    distinct = list(dict.fromkeys(ids))
    return [t for t, token in zip(distinct, tokenizer.convert_ids_to_tokens(distinct))
            if token is None]
