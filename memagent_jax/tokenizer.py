"""The tokenizer and stop tokens that belong to a model directory (HF or our checkpoint), and
what a tokenizer cannot represent: text it reads as its unknown token, ids it has no token for."""

from __future__ import annotations

import json
import os

from memagent_jax.errors import UserError
from memagent_jax.models.checkpoint import side_files_dir
from memagent_jax.models.config import ModelConfig

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def side_dirs(model_path: str) -> list[str]:
    """Where a model's tokenizer/generation files live: an HF dir, or a checkpoint's copy."""
    return [model_path, side_files_dir(model_path)]


def load_tokenizer(model_path: str):
    """transformers' tokenizer for the model, or None when the directory has none.

    tokenizer.json is loaded as written (PreTrainedTokenizerFast); AutoTokenizer would pick
    the class from config.json's model_type instead, and rebuild it from vocab/merges files.
    """
    for directory in side_dirs(model_path):
        if os.path.isfile(os.path.join(directory, "tokenizer.json")):
            from transformers import PreTrainedTokenizerFast  # heavy; only for text
            return PreTrainedTokenizerFast.from_pretrained(directory)
        if any(os.path.isfile(os.path.join(directory, f)) for f in _TOKENIZER_FILES):
            from transformers import AutoTokenizer
            return AutoTokenizer.from_pretrained(directory)
    return None


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
    """The distinct pieces of `text` that `tokenizer` reads as its unknown token
    (`unknown_id`), in order of first appearance."""
    unk = unknown_id(tokenizer)
    if unk is None:
        return []
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(dict.fromkeys(text[start:end] for token, (start, end)
                              in zip(encoded["input_ids"], encoded["offset_mapping"])
                              if token == unk))


def check_representable(tokenizer, text: str, what: str) -> None:
    """UserError naming `what` and the words of `text` the tokenizer cannot represent (the
    model would read its unknown token in their place and answer something made up)."""
    words = unknown_words(tokenizer, text)
    if words:
        shown = ", ".join(repr(w) for w in words[:5])
        more = f" and {len(words) - 5} more" if len(words) > 5 else ""
        unk = tokenizer.convert_ids_to_tokens(unknown_id(tokenizer))
        raise UserError(f"{what}: the tokenizer has no token for {shown}{more} (the model "
                        f"would read {unk} in their place)")


def undecodable_ids(tokenizer, ids) -> list[int]:
    """The distinct ids of `ids` the tokenizer has no token for (past its vocabulary: they
    decode to nothing), in order of first appearance."""
    distinct = list(dict.fromkeys(ids))
    return [t for t, token in zip(distinct, tokenizer.convert_ids_to_tokens(distinct))
            if token is None]
