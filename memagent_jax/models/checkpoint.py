"""Our model checkpoint directory: Orbax parameters plus the HF config and side files.

    CKPT/model_config.json   the HF config.json of the model (torch_dtype = stored dtype)
    CKPT/params/             Orbax checkpoint of the parameters (the `qwen2.Params` tree)
    CKPT/hf_files/           tokenizer and generation files of the source, for export

The whole directory is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import json
import os

import orbax.checkpoint as ocp

from memagent_jax.errors import UserError
from memagent_jax.fileutil import atomic_directory
from memagent_jax.models import mapping
from memagent_jax.models.config import ModelConfig
from memagent_jax.models.hf_checkpoint import copy_side_files
from memagent_jax.models.qwen2 import Params

CONFIG_FILE = "model_config.json"
PARAMS_DIR = "params"
SIDE_DIR = "hf_files"


def is_checkpoint_directory(path: str) -> bool:
    return (os.path.isfile(os.path.join(path, CONFIG_FILE))
            and os.path.isdir(os.path.join(path, PARAMS_DIR)))


def write_checkpoint(params: Params, config: ModelConfig, out_dir: str,
                     side_files_dir: str | None = None) -> None:
    with atomic_directory(out_dir) as tmp:
        with open(os.path.join(tmp, CONFIG_FILE), "w") as f:
            json.dump(config.to_hf_dict(), f, indent=2, sort_keys=True)
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(os.path.join(tmp, PARAMS_DIR), params)
        checkpointer.wait_until_finished()
        os.makedirs(os.path.join(tmp, SIDE_DIR))
        if side_files_dir:
            copy_side_files(side_files_dir, os.path.join(tmp, SIDE_DIR))


def read_params(ckpt_dir: str, config: ModelConfig, targets: Params) -> Params:
    """Restores the parameter tree onto targets (a `Params` tree of ShapeDtypeStructs with
    shardings). A checkpoint whose tree differs from the targets' (another depth, or an older
    memagent-jax layout) is a UserError naming the first parameter that differs."""
    path = os.path.abspath(os.path.join(ckpt_dir, PARAMS_DIR))
    checkpointer = ocp.StandardCheckpointer()
    stored, expected = _paths(checkpointer.metadata(path).item_metadata.tree), _paths(targets)
    if stored != expected:
        missing = [ours for _, ours, _ in mapping.tensors(config) if ours not in stored]
        differences = ([f"missing '{missing[0]}'"] if missing else []) + (
            [f"unexpected '{min(stored - expected)}'"] if stored - expected else [])
        raise UserError(f"{path}: the stored parameters do not match the model in "
                        f"{CONFIG_FILE} ({', '.join(differences)}); a checkpoint of an older "
                        "memagent-jax layout needs `memagent-jax convert` again")
    return checkpointer.restore(path, targets)


def _paths(tree: dict) -> set[str]:
    return set(mapping.flatten(tree))


def side_files_dir(ckpt_dir: str) -> str:
    return os.path.join(ckpt_dir, SIDE_DIR)


def config_path(ckpt_dir: str) -> str:
    return os.path.join(ckpt_dir, CONFIG_FILE)

