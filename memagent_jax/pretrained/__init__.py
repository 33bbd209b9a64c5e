"""Models shipped inside the package, addressable by name wherever a model path is taken:
`--model NAME` (`run`, `generate`, `demo`), `model.path: NAME` (`eval`, `train`),
`export --model NAME`, and in Python `models.load_model(NAME)`, `tokenizer.load_tokenizer(NAME)`.

A shipped model is a Hugging Face directory under this package (config.json,
model.safetensors, tokenizer files, generation_config.json: it loads in `transformers` as it
is) plus `memagent.json`, the memory loop's budgets it was trained with (MemAgentConfig's
fields), which `run` and `demo` use unless given others. A directory on disk of the same name
takes precedence over the shipped model.

`memagent-tiny` is the synthetic recipe's DAPO model (docs/synthetic.md): a Qwen2 of 128
hidden units and 4 layers over the synthetic tasks' word-level tokenizer, `demo`'s default.
"""

from __future__ import annotations

import json
import os

_ROOT = os.path.dirname(os.path.abspath(__file__))
BUDGETS_FILE = "memagent.json"


def names() -> list[str]:
    """The shipped models: the model directories in this package."""
    return sorted(n for n in os.listdir(_ROOT)
                  if os.path.isfile(os.path.join(_ROOT, n, "config.json")))


def resolve(path: str) -> str:
    """The directory `path` names: a shipped model's, for one of `names()` not found on
    disk; else `path` itself, `~` expanded."""
    path = os.path.expanduser(path)
    if not os.path.exists(path) and path in names():
        return os.path.join(_ROOT, path)
    return path


def budgets(model_dir: str | None, **given) -> dict:
    """MemAgentConfig's fields for a model: those `given` (None: not given) over those its
    directory records (`memagent.json`, beside the weights or in a checkpoint's side files;
    none for model_dir None, a served model)."""
    from memagent_jax.tokenizer import side_dirs
    recorded = {}
    for directory in side_dirs(model_dir) if model_dir is not None else ():
        path = os.path.join(directory, BUDGETS_FILE)
        if os.path.isfile(path):
            with open(path) as f:
                recorded = json.load(f)
            break
    return {**recorded, **{k: v for k, v in given.items() if v is not None}}
