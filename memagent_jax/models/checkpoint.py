"""Our checkpoint directories: a converted model, or a training run's checkpoints.

A converted model (`memagent-jax convert`, `save_checkpoint`):
    CKPT/model_config.json   the HF config.json of the model (torch_dtype = stored dtype)
    CKPT/params/             Orbax checkpoint of the parameters (the `qwen.Params` tree)
    CKPT/hf_files/           tokenizer and generation files of the source, for export
written under a temporary name and renamed when complete.

A training run (`memagent-jax train`, rl/checkpointing.py) keeps, in its checkpoint directory:
    CHECKPOINTS/model/       model_config.json and hf_files/ as above (`write_model_files`:
                             the model and the tokenizer the run trains), no parameters;
                             under LoRA also lora.json (`LORA_FILE`: the base, its stored
                             dtype and `weights_fingerprint`, the adapters' rank, alpha and
                             targets)
    CHECKPOINTS/<step>/state the learner's Orbax tree {params, opt_state, step} (params: the
                             adapters under LoRA)
A model path may name a step directory, the checkpoint directory (its newest step) or the run's
output directory (`checkpoints/` below it, newest step); `model_dir.locate` resolves all of
them, and loading reads only the `params` of the step's state.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from memagent_jax.distributed import collectives
from memagent_jax.errors import UserError
from memagent_jax.fileutil import atomic_directory, is_disk_full
from memagent_jax.model_dir import CONFIG_FILE, PARAMS_DIR, SIDE_DIR, locate, resolve
from memagent_jax.models import mapping
from memagent_jax.models.config import ModelConfig
from memagent_jax.models.hf_checkpoint import copy_side_files
from memagent_jax.models.qwen import Params


def quiet_failed_writes() -> None:
    """Keeps off stderr what Orbax's background work prints once one of its writes failed
    for a full disk, which the command reports in one line: TensorStore's writes still in
    flight complete into an event loop Orbax has closed (a "RuntimeError: Event loop is
    closed" traceback each, dozens per checkpoint), their coroutines are collected at exit
    ("ImportError: sys.meta_path is None") or logged by asyncio as "Task exception was never
    retrieved" (naming Orbax's coroutine) or "Future exception was never retrieved" (naming
    only TensorStore's error: a full-disk failure asyncio reports is a writer's), and Orbax
    logs the failure with its traceback from each thread that saw it.
    Other errors are reported as before. Installed once per process, by whatever writes with
    Orbax."""
    global _quieted
    if _quieted:
        return
    _quieted = True
    previous = sys.unraisablehook

    def unraisable(report, previous=previous, finalizing=sys.is_finalizing):
        late = (finalizing() and getattr(getattr(report.object, "cr_code", None),
                                         "co_filename", "").find(_ORBAX) >= 0)
        closed = (isinstance(report.exc_value, RuntimeError)
                  and str(report.exc_value) == "Event loop is closed")
        if not (late or closed):
            previous(report)

    def keep(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        error = record.exc_info[1] if record.exc_info else Exception(message)
        about_orbax = (_ORBAX in record.pathname or _ORBAX in message  # asyncio names the coro
                       or record.name == "asyncio")  # or a bare future: TensorStore's write
        return not (about_orbax and record.levelno >= logging.ERROR and is_disk_full(error))

    sys.unraisablehook = unraisable
    for logger in ("absl", "asyncio"):
        logging.getLogger(logger).addFilter(keep)


_quieted = False
_ORBAX = f"{os.sep}orbax{os.sep}"


LORA_FILE = "lora.json"


def write_model_files(config: ModelConfig, out_dir: str, side_dirs: list[str],
                      side_json: dict[str, dict] | None = None,
                      lora: dict | None = None) -> None:
    """A training run's model description: model_config.json and hf_files/ (the side files of
    `side_dirs`, the first found of each kept, then `side_json`'s files, name -> content,
    replacing copies), and `lora` as lora.json where given, written all or nothing, by
    process 0 of a multi-process job (every process calls it)."""
    with atomic_directory(out_dir) as tmp:
        if not collectives.is_main():
            return
        os.makedirs(os.path.join(tmp, SIDE_DIR))
        copied: set[str] = set()
        for directory in side_dirs:
            copied |= set(copy_side_files(directory, os.path.join(tmp, SIDE_DIR),
                                          skip=copied))
        for name, content in (side_json or {}).items():
            with open(os.path.join(tmp, SIDE_DIR, name), "w") as f:
                json.dump(content, f, indent=2, sort_keys=True)
        with open(os.path.join(tmp, CONFIG_FILE), "w") as f:
            json.dump(config.to_hf_dict(), f, indent=2, sort_keys=True)
        if lora is not None:
            with open(os.path.join(tmp, LORA_FILE), "w") as f:
                json.dump(lora, f, indent=2, sort_keys=True)


def lora_record(path: str) -> dict | None:
    """The lora.json of the LoRA training run a checkpoint path names, else None."""
    where = locate(resolve(path))
    file = where and os.path.join(where.files_dir, LORA_FILE)
    if not file or not os.path.isfile(file):
        return None
    with open(file) as f:
        return json.load(f)


def base_name(record: dict) -> str:
    """A LoRA record's base, as its run's model section named it."""
    name = record["path"] or f"preset {record['preset']} (init_seed {record['init_seed']})"
    return name + (f" + {record['merged_adapter']}" if record.get("merged_adapter") else "")


def write_checkpoint(params: Params, config: ModelConfig, out_dir: str,
                     side_files_dir: str | None = None) -> None:
    """Our checkpoint directory (module docstring), all or nothing; in a multi-process job
    every process calls it and writes its shards of the parameters."""
    quiet_failed_writes()
    with atomic_directory(out_dir) as tmp:
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(os.path.join(tmp, PARAMS_DIR), params)
        checkpointer.wait_until_finished()
        if collectives.is_main():
            with open(os.path.join(tmp, CONFIG_FILE), "w") as f:
                json.dump(config.to_hf_dict(), f, indent=2, sort_keys=True)
            os.makedirs(os.path.join(tmp, SIDE_DIR))
            if side_files_dir:
                copy_side_files(side_files_dir, os.path.join(tmp, SIDE_DIR))


def read_params(ckpt_dir: str, config: ModelConfig, targets: Params) -> Params:
    """Restores the parameter tree onto targets (a `Params` tree of ShapeDtypeStructs with
    shardings). A checkpoint whose tree differs from the targets' (another depth, or an older
    memagent-jax layout) is a UserError naming the first parameter that differs."""
    where = locate(ckpt_dir)
    if where is None:
        raise UserError(f"{ckpt_dir}: not a memagent-jax checkpoint")
    path = os.path.abspath(where.params)
    # The handler, not a Checkpointer: that would look for a training step's metadata inside
    # its state item and warn that it is missing.
    tree = ocp.PyTreeCheckpointHandler().metadata(epath.Path(path)).tree
    if where.subtree is not None:
        tree = tree[where.subtree]
        path = f"{path} ({where.subtree})"
    stored, expected = _paths(tree), _paths(targets)
    if stored != expected:
        missing = [ours for _, ours, _ in mapping.tensors(config) if ours not in stored]
        differences = ([f"missing '{missing[0]}'"] if missing else []) + (
            [f"unexpected '{min(stored - expected)}'"] if stored - expected else [])
        raise UserError(f"{path}: the stored parameters do not match the model in "
                        f"{CONFIG_FILE} ({', '.join(differences)}); a checkpoint of an older "
                        "memagent-jax layout needs `memagent-jax convert` again")
    if where.subtree is None:
        return ocp.StandardCheckpointer().restore(where.params, targets)
    item = {where.subtree: targets}
    restored = ocp.PyTreeCheckpointHandler().restore(epath.Path(where.params), args=(
        ocp.args.PyTreeRestore(item=item, partial_restore=True,
                               restore_args=ocp.checkpoint_utils.construct_restore_args(item))))
    return restored[where.subtree]


def _paths(tree: dict) -> set[str]:
    return set(mapping.flatten(tree))


def weights_fingerprint(params: Any) -> str:
    """16 hex digits that tell one set of weights from another: each array's bits summed as
    unsigned integers, plainly and weighted by position, hashed with the tree's paths and
    dtypes. Integer sums wrap but never round, so the digest is the same on every mesh and
    number of processes."""
    leaves = jax.tree_util.tree_leaves_with_path(params)

    def sums(arrays):
        out = []
        for x in arrays:
            unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[jnp.dtype(x.dtype).itemsize]
            bits = jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32).reshape(-1)
            weights = jnp.arange(bits.size, dtype=jnp.uint32) % 65521 + 1
            out.append(jnp.stack([bits.sum(dtype=jnp.uint32),
                                  (bits * weights).sum(dtype=jnp.uint32)]))
        return jnp.stack(out)

    values = np.asarray(jax.jit(sums)([x for _, x in leaves]))
    digest = hashlib.sha256(values.tobytes())
    for path, x in leaves:
        digest.update(f"{jax.tree_util.keystr(path)}:{jnp.dtype(x.dtype).name}".encode())
    return digest.hexdigest()[:16]
