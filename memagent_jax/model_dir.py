"""A model directory: where a model path's pieces are (standard library only).

A model path is one of:
- a Hugging Face directory (config.json, safetensors, tokenizer and generation files);
- our converted checkpoint (`memagent-jax convert`, models/checkpoint.py):
      CKPT/model_config.json   the HF config.json of the model (torch_dtype = stored dtype)
      CKPT/params/             Orbax checkpoint of the parameters
      CKPT/hf_files/           tokenizer and generation files of the source, for export
- a training run's checkpoints (`memagent-jax train`, rl/checkpointing.py):
      CHECKPOINTS/model/       model_config.json and hf_files/ as above, no parameters
      CHECKPOINTS/<step>/state the learner's Orbax tree {params, opt_state, step}
  named by a step directory, the checkpoint directory (its newest step) or the run's output
  directory (`checkpoints/` below it, newest step);
- the name of a model shipped in this package (`memagent_jax/pretrained/NAME`, a Hugging Face
  directory plus memagent.json), unless a directory of that name exists on disk.

Beside its weights a model may record the memory loop's budgets it was trained with
(`memagent.json`, MemAgentConfig's fields), which `run` and `demo` use unless given others.
"""

from __future__ import annotations

import dataclasses
import json
import os

from memagent_jax.errors import UserError

SHIPPED_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pretrained")
BUDGETS_FILE = "memagent.json"
CONFIG_FILE = "model_config.json"
PARAMS_DIR = "params"
SIDE_DIR = "hf_files"
TRAINING_MODEL_DIR = "model"   # beside a training run's step directories
TRAINING_STATE = "state"       # a step directory's learner state, whose "params" we read


def shipped_names() -> list[str]:
    """The shipped models: the model directories under `SHIPPED_ROOT`."""
    return sorted(n for n in os.listdir(SHIPPED_ROOT)
                  if os.path.isfile(os.path.join(SHIPPED_ROOT, n, "config.json")))


def resolve(path: str) -> str:
    """The directory `path` names: a shipped model's, for one of `shipped_names()` not found
    on disk; else `path` itself, `~` expanded."""
    path = os.path.expanduser(path)
    if not os.path.exists(path) and path in shipped_names():
        return os.path.join(SHIPPED_ROOT, path)
    return path


@dataclasses.dataclass(frozen=True)
class Stored:
    """Where a checkpoint's pieces are: files_dir holds model_config.json and hf_files/;
    params is the Orbax directory holding the parameters (`subtree`: under that key)."""
    files_dir: str
    params: str
    subtree: str | None = None


def locate(path: str) -> Stored | None:
    """The checkpoint a path names (module docstring), or None if it names none; its paths
    are absolute (Orbax refuses relative ones)."""
    path = os.path.abspath(path)
    if (os.path.isfile(os.path.join(path, CONFIG_FILE))
            and os.path.isdir(os.path.join(path, PARAMS_DIR))):
        return Stored(path, os.path.join(path, PARAMS_DIR))
    step = training_step_dir(path)
    if step is None:
        return None
    return Stored(os.path.join(os.path.dirname(step), TRAINING_MODEL_DIR),
                  os.path.join(step, TRAINING_STATE), "params")


def training_step_dir(path: str) -> str | None:
    """The step directory a training-checkpoint path names, or None."""
    path = os.path.abspath(path)
    if os.path.isdir(os.path.join(path, TRAINING_STATE)) and _has_model_files(
            os.path.dirname(path)):
        return path
    for directory in (path, os.path.join(path, "checkpoints")):
        if _has_model_files(directory):
            steps = [int(n) for n in os.listdir(directory) if n.isdigit()
                     and os.path.isdir(os.path.join(directory, n, TRAINING_STATE))]
            if not steps:
                raise UserError(f"{directory}: a training checkpoint directory without any "
                                "finished step")
            return os.path.join(directory, str(max(steps)))
    return None


def is_checkpoint_directory(path: str) -> bool:
    return locate(path) is not None


def _has_model_files(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, TRAINING_MODEL_DIR, CONFIG_FILE))


def side_files_dir(path: str) -> str:
    """Where a model path's tokenizer and generation files (and memagent.json) are: a
    checkpoint's copy (of any kind of checkpoint path), else the directory itself (an HF
    directory, or a shipped model's name)."""
    path = resolve(path)
    where = locate(path)
    return os.path.join(where.files_dir, SIDE_DIR) if where else path


def config_path(path: str) -> str:
    """A checkpoint's model_config.json."""
    where = locate(path)
    if where is None:
        raise UserError(f"{path}: not a memagent-jax checkpoint")
    return os.path.join(where.files_dir, CONFIG_FILE)


def side_dirs(model_path: str) -> list[str]:
    """Where a model's tokenizer and generation files (and memagent.json) may live, in order:
    an HF directory, or a checkpoint's copy (`model_path` may be a shipped model's name)."""
    model_path = resolve(model_path)
    return [model_path, side_files_dir(model_path)]


def budgets(model_path: str | None, **given) -> dict:
    """MemAgentConfig's fields for a model: those `given` (None: not given) over those its
    directory records (`memagent.json`, beside the weights or in a checkpoint's side files;
    none for model_path None, a served model)."""
    recorded = {}
    for directory in side_dirs(model_path) if model_path is not None else ():
        path = os.path.join(directory, BUDGETS_FILE)
        if os.path.isfile(path):
            with open(path) as f:
                recorded = json.load(f)
            break
    return {**recorded, **{k: v for k, v in given.items() if v is not None}}
