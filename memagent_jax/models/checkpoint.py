"""Our model checkpoint directory: Orbax parameters plus the HF config and side files.

    CKPT/model_config.json   the HF config.json of the model (torch_dtype = stored dtype)
    CKPT/params/             Orbax checkpoint of the parameter tree ({'embed', 'layers': {0: ...}})
    CKPT/hf_files/           tokenizer and generation files of the source, for export

The whole directory is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import json
import os

import jax
import orbax.checkpoint as ocp

from memagent_jax.errors import UserError
from memagent_jax.fileutil import atomic_directory
from memagent_jax.models.config import ModelConfig
from memagent_jax.models.hf_checkpoint import copy_side_files

CONFIG_FILE = "model_config.json"
PARAMS_DIR = "params"
SIDE_DIR = "hf_files"


def is_checkpoint_directory(path: str) -> bool:
    return (os.path.isfile(os.path.join(path, CONFIG_FILE))
            and os.path.isdir(os.path.join(path, PARAMS_DIR)))


def write_checkpoint(params: dict, config: ModelConfig, out_dir: str,
                     side_files_dir: str | None = None) -> None:
    """params: the nested parameter tree of arrays (as `nnx.to_pure_dict` gives it)."""
    with atomic_directory(out_dir) as tmp:
        with open(os.path.join(tmp, CONFIG_FILE), "w") as f:
            json.dump(config.to_hf_dict(), f, indent=2, sort_keys=True)
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(os.path.join(tmp, PARAMS_DIR), params)
        checkpointer.wait_until_finished()
        os.makedirs(os.path.join(tmp, SIDE_DIR))
        if side_files_dir:
            copy_side_files(side_files_dir, os.path.join(tmp, SIDE_DIR))


def read_params(ckpt_dir: str, targets: dict) -> dict:
    """Restores the parameter tree onto targets (nested ShapeDtypeStructs with shardings).
    A checkpoint whose tree differs from the targets' (another depth, or the stacked layers
    of memagent-jax before 2026-11-23) is a UserError naming a parameter that differs."""
    path = os.path.abspath(os.path.join(ckpt_dir, PARAMS_DIR))
    checkpointer = ocp.StandardCheckpointer()
    stored, expected = _paths(checkpointer.metadata(path).item_metadata.tree), _paths(targets)
    if stored != expected:
        differences = ([f"missing '{min(expected - stored)}'"] if expected - stored else []) + (
            [f"unexpected '{min(stored - expected)}'"] if stored - expected else [])
        raise UserError(f"{path}: the stored parameters do not match the model in "
                        f"{CONFIG_FILE} ({', '.join(differences)}); a checkpoint from before "
                        "per-layer parameters (2026-11-23) needs `memagent-jax convert` again")
    return checkpointer.restore(path, targets)


def _paths(tree: dict) -> set[str]:
    return {"/".join(str(getattr(key, "key", key)) for key in path)
            for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]}


def side_files_dir(ckpt_dir: str) -> str:
    return os.path.join(ckpt_dir, SIDE_DIR)


def config_path(ckpt_dir: str) -> str:
    return os.path.join(ckpt_dir, CONFIG_FILE)

