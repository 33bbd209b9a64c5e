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
    return backend.token_to_id(token) if token and backend is not None else None


def unreadable_parts(tokenizer, text: str, unknown: bool = True) -> list[str]:
    """The distinct parts of `text` that `tokenizer` reads as its unknown token (`unknown_id`;
    unless `unknown` is False: a model has a row for it) or as pieces from `PIECE_IDS` on (a
    word tokenizer's bytes, data/word_tokenizer.py: no model has rows for them), in
    order of first appearance, each as a user is shown it: a word it cannot read quoted
    ('zebra'); whitespace that it cannot read between words it can (a word tokenizer's two
    spaces, line break, trailing space) quoted with where it is ("'  ' between 'is' and 'the'",
    "' ' after 'is' at the end")."""
    unk = unknown_id(tokenizer) if unknown else None
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = [span for i, span in zip(encoded["input_ids"], encoded["offset_mapping"])
             if i == unk or i >= PIECE_IDS]
    if not spans:
        return []
    words = list(dict.fromkeys(text.split()))
    bad = {w for w, ids in zip(words, tokenizer(words, add_special_tokens=False)["input_ids"]
                                      if words else [])
           if any(i == unk or i >= PIECE_IDS for i in ids)}
    parts, last = [], 0
    for start, end in spans:
        if end <= last:  # in the word or whitespace just named
            continue
        inside = next((k for k in range(max(start, last), end) if not text[k].isspace()), None)
        if inside is None:  # whitespace: its own fault unless it is a bad word's
            first, last = _extend(text, start, end, str.isspace)
            if not {_word_before(text, first), _word_after(text, last)} & bad:
                parts.append(_whitespace(text, first, last))
            continue
        first, last = _extend(text, inside, inside + 1, _visible)
        if text[first:last] in bad or first == 0:
            parts.append(repr(text[first:last]))
        else:  # a word that reads alone, not after this whitespace
            parts.append(_whitespace(text, *_extend(text, first - 1, first, str.isspace)))
    return list(dict.fromkeys(parts))


def _visible(c: str) -> bool:
    return not c.isspace()


def _extend(text: str, start: int, end: int, keep) -> tuple[int, int]:
    """[start, end) grown both ways over the characters `keep` is true of."""
    while start > 0 and keep(text[start - 1]):
        start -= 1
    while end < len(text) and keep(text[end]):
        end += 1
    return start, end


def _word_before(text: str, end: int) -> str:
    """The word ending at `end` (where a run of whitespace starts); "" at the start."""
    return text[_extend(text, end, end, _visible)[0]:end]


def _word_after(text: str, start: int) -> str:
    """The word starting at `start` (where a run of whitespace ends); "" at the end."""
    return text[start:_extend(text, start, start, _visible)[1]]


def _whitespace(text: str, start: int, end: int) -> str:
    """The whitespace text[start:end] (a whole run) quoted, with the words around it."""
    run, before, after = text[start:end], _word_before(text, start), _word_after(text, end)
    if before and after:
        return f"{run!r} between {before!r} and {after!r}"
    if before:
        return f"{run!r} after {before!r} at the end"
    return f"{run!r} at the start, before {after!r}" if after else f"{run!r} (all the text)"


def check_representable(tokenizer, text: str, what: str, unknown: bool = True,
                         among: set[str] | None = None) -> None:
    """UserError naming `what` and the parts of `text` the tokenizer cannot represent (the
    model would read its unknown token in their place, or ids it has no rows for; unknown
    False: the latter only, `unreadable_parts`); among: only those of these parts."""
    parts = [p for p in unreadable_parts(tokenizer, text, unknown)
             if among is None or p in among]
    if parts:
        shown = ", ".join(parts[:5])
        more = f" and {len(parts) - 5} more" if len(parts) > 5 else ""
        unk = unknown_id(tokenizer) if unknown else None
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
