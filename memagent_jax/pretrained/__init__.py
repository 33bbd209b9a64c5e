"""Models shipped inside the package, addressable by name wherever a model path is taken:
`--model memagent-tiny` (`run`, `generate`, `demo`), `model.path: memagent-tiny` (`eval`,
`train`), `export --ckpt memagent-tiny`.

A shipped model is a Hugging Face directory under this package (config.json,
model.safetensors, tokenizer files, generation_config.json: it loads in `transformers` as it
is) plus `memagent.json`, the memory loop's budgets it was trained with (MemAgentConfig's
fields), which `run` and `demo` use unless given others. A directory on disk of the same name
takes precedence over the shipped model.

memagent-tiny: a Qwen2 of 128 hidden units and 4 layers over the synthetic tasks' word-level
tokenizer (`data.synthetic`), trained by the recipe of README's "A memory agent trained from
scratch" (supervised warm-up, then DAPO through the memory loop).
"""

from __future__ import annotations

import json
import os

NAMES = ("memagent-tiny",)
_ROOT = os.path.dirname(os.path.abspath(__file__))
BUDGETS_FILE = "memagent.json"


def resolve(path: str) -> str:
    """The directory `path` names: a shipped model's, for one of NAMES not found on disk;
    else `path` itself."""
    if path in NAMES and not os.path.exists(path):
        return os.path.join(_ROOT, path)
    return path


def budgets(model_dir: str, **given) -> dict:
    """MemAgentConfig's fields for a model: those `given` (None: not given) over those its
    directory records (`memagent.json`, beside the weights or in a checkpoint's side files)."""
    from memagent_jax.models.checkpoint import side_files_dir
    recorded = {}
    for directory in (model_dir, side_files_dir(model_dir)):
        path = os.path.join(directory, BUDGETS_FILE)
        if os.path.isfile(path):
            with open(path) as f:
                recorded = json.load(f)
            break
    return {**recorded, **{k: v for k, v in given.items() if v is not None}}
