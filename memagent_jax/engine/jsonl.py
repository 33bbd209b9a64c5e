"""The `generate` command's files: prompts in, completions out, one JSON object per line."""

from __future__ import annotations

import json
import math

from memagent_jax.errors import UserError
from memagent_jax.fileutil import atomic_file, check_input_file, json_lines
from memagent_jax.tokenizer import check_representable, undecodable_ids


def read_prompts(path: str, tokenizer, vocab_size: int) -> list[list[int]]:
    """Lines {"prompt": str} (needs a tokenizer that represents every word) or {"prompt_ids":
    [int, ...]}, every id below vocab_size and, with a tokenizer, one it has a token for; blank
    lines are skipped. Errors name the file and line number."""
    check_input_file(path)
    prompts = []
    for number, item in json_lines(path):
        where = f"{path} line {number}"
        if not isinstance(item, dict) or ("prompt" in item) == ("prompt_ids" in item):
            raise UserError(f"{where}: expected an object with exactly one of 'prompt' or "
                            "'prompt_ids'")
        if "prompt_ids" in item:
            ids = item["prompt_ids"]
            if not isinstance(ids, list) or not all(isinstance(t, int) and t >= 0 for t in ids):
                raise UserError(f"{where}: 'prompt_ids' must be a list of token ids")
        else:
            if not isinstance(item["prompt"], str):
                raise UserError(f"{where}: 'prompt' must be a string")
            if tokenizer is None:
                raise UserError(f"{where}: a text 'prompt' needs a tokenizer and the model "
                                "directory has none: pass --tokenizer DIR, or give "
                                "'prompt_ids'")
            check_representable(tokenizer, item["prompt"], where)
            ids = tokenizer(item["prompt"])["input_ids"]
        if not ids:
            raise UserError(f"{where}: empty prompt")
        outside = [t for t in ids if t >= vocab_size]
        if outside:
            raise UserError(f"{where}: token id {outside[0]} is outside the model's vocabulary "
                            f"of {vocab_size} ids")
        missing = undecodable_ids(tokenizer, ids) if tokenizer is not None else []
        if missing:
            raise UserError(f"{where}: token id {missing[0]} has no token in the tokenizer's "
                            f"vocabulary of {len(tokenizer)} (its text would be empty)")
        prompts.append(ids)
    if not prompts:
        raise UserError(f"{path}: no prompts")
    return prompts


def write_completions(path: str, rows: list[dict]) -> None:
    """Writes all rows, whole or not at all (`atomic_file`). A non-finite logprob is written
    as null: JSON has no NaN."""
    with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            row = dict(row, logprobs=[x if math.isfinite(x) else None
                                      for x in row["logprobs"]])
            f.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
