"""Hugging Face checkpoint directories: streaming load onto a sharding, and export.

Loading checks every file and tensor against the config before any device work, then places
the memory-mapped tensors on the devices one at a time (see `_build`), so the host never holds
more than one HF tensor beyond the model itself. Export writes safetensors shards (with an index
above `max_shard_bytes`) tensor by tensor, in a temporary directory renamed into place at the
end, with the bos/eos/pad ids the tokenizer declares where the config has none (transformers'
generate() stops only at an eos_token_id it is given).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from memagent_jax.distributed import collectives
from memagent_jax.errors import UserError
from memagent_jax.fileutil import atomic_directory
from memagent_jax.models import mapping
from memagent_jax.models.config import ModelConfig
from memagent_jax.models.qwen import Params
from memagent_jax.models.safetensors_io import TensorInfo, read_header, write_file

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Files besides weights and config.json that make an HF directory usable; carried through
# convert -> export untouched.
SIDE_FILES = (
    "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
    "merges.txt", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
    "chat_template.json",
    "memagent.json",  # the memory loop's budgets a model was trained with (`pretrained`)
)
DEFAULT_MAX_SHARD_BYTES = 5 * 1024 ** 3
# Written into config.json and generation_config.json from the tokenizer where they lack them.
SPECIAL_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def is_hf_directory(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json"))


def scan_weights(hf_dir: str) -> dict[str, TensorInfo]:
    """Every tensor in the directory's safetensors file(s), headers checked."""
    index_path = os.path.join(hf_dir, INDEX_FILE)
    if os.path.isfile(index_path):
        try:
            with open(index_path) as f:
                weight_map = json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise UserError(f"{index_path}: not a valid safetensors index ({e})") from None
        files = sorted(set(weight_map.values()))
    elif os.path.isfile(os.path.join(hf_dir, SINGLE_FILE)):
        weight_map, files = None, [SINGLE_FILE]
    else:
        raise UserError(f"{hf_dir}: no {SINGLE_FILE} or {INDEX_FILE} found")
    infos: dict[str, TensorInfo] = {}
    for name in files:
        path = os.path.join(hf_dir, name)
        if not os.path.isfile(path):
            raise UserError(f"{path}: not found (listed in {INDEX_FILE})")
        infos.update(read_header(path))
    if weight_map is not None:
        for tensor, file in weight_map.items():
            if tensor not in infos:
                raise UserError(f"{os.path.join(hf_dir, file)}: tensor '{tensor}' listed in "
                                f"{INDEX_FILE} is missing from the file")
    return infos


def read_params(hf_dir: str, config: ModelConfig, targets: Params) -> Params:
    """Loads every parameter onto its target (a `Params` tree of ShapeDtypeStructs with
    shardings)."""
    infos = scan_weights(hf_dir)
    flat: dict[str, Any] = mapping.flatten(targets)  # ShapeDtypeStructs
    plan = _check_tensors(infos, config, flat, hf_dir)
    return mapping.nest({ours: _build(row, infos[name], flat[ours])
                         for row, ours, name in plan})


def _check_tensors(infos, config, targets, hf_dir):
    """Checks presence and shape of every expected tensor; rejects unknown ones."""
    plan = mapping.tensors(config)
    for row, ours, name in plan:
        want = mapping.hf_shape(row, targets[ours].shape)
        info = infos.get(name)
        if info is None:
            raise UserError(f"{hf_dir}: tensor '{name}' not found in any safetensors file")
        if info.shape != want:
            raise UserError(f"{info.file}: tensor '{name}' has shape {list(info.shape)}, "
                            f"config.json implies {list(want)}")
    expected = {name for _, _, name in plan}
    for name in infos:
        ignorable = name.endswith(mapping.IGNORED_HF_SUFFIXES) or (
            name == "lm_head.weight" and config.tie_word_embeddings)
        if name not in expected and not ignorable:
            raise UserError(f"{infos[name].file}: unexpected tensor '{name}' for a "
                            f"{config.num_layers}-layer Qwen config")
    return plan


def _build(row: mapping.Row, info: TensorInfo, target: jax.ShapeDtypeStruct) -> jax.Array:
    """One parameter, placed device shard by device shard from the memory-mapped tensor, so the
    host holds at most one shard's copy beside the model."""
    shape, dtype, sharding = target.shape, target.dtype, target.sharding
    full = mapping.to_ours(row, info.read(), shape)  # a view of the memory map
    buffers = [jax.device_put(np.ascontiguousarray(full[index]).astype(dtype), device)
               for device, index in sharding.addressable_devices_indices_map(shape).items()]
    return jax.make_array_from_single_device_arrays(shape, sharding, buffers)


def write_directory(params: Params, config: ModelConfig, out_dir: str,
                    side_files_dir: str | None = None,
                    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                    poll: Callable[[], None] = lambda: None) -> None:
    """Writes an HF directory from our parameters, all or nothing. In a multi-process job every
    process calls it: each tensor is gathered from all hosts, and process 0 writes. poll() is
    called before each tensor, on every process (`save_hf`)."""
    flat: dict[str, Any] = mapping.flatten(params)
    params = flat

    def produce(row, array):
        poll()
        return mapping.to_hf(row, collectives.to_host(array))

    tensors = [(name, params[ours].dtype, mapping.hf_shape(row, params[ours].shape),
                functools.partial(produce, row, params[ours]))
               for row, ours, name in mapping.tensors(config)]
    shards = _split_into_shards(tensors, max_shard_bytes)
    with atomic_directory(out_dir) as tmp:
        if not collectives.is_main():
            for tensor in tensors:  # the gathers are collective: the same ones, in order
                tensor[3]()
            return
        weight_map = {}
        for k, shard in enumerate(shards):
            file = (SINGLE_FILE if len(shards) == 1
                    else f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors")
            write_file(os.path.join(tmp, file), shard)
            weight_map.update({t[0]: file for t in shard})
        if len(shards) > 1:
            total = sum(np.dtype(t[1]).itemsize * int(np.prod(t[2])) for t in tensors)
            _write_json(os.path.join(tmp, INDEX_FILE),
                        {"metadata": {"total_size": total}, "weight_map": weight_map})
        hf_config = config.to_hf_dict()
        declared = tokenizer_special_ids(side_files_dir) if side_files_dir else {}
        hf_config.update({key: value for key, value in declared.items()
                          if hf_config.get(key) is None})
        _write_json(os.path.join(tmp, "config.json"), hf_config)
        copied = copy_side_files(side_files_dir, tmp) if side_files_dir else []
        generation_path = os.path.join(tmp, "generation_config.json")
        generation = {"do_sample": False}
        if "generation_config.json" in copied:
            with open(generation_path) as f:
                generation = json.load(f)
        # transformers' generate() stops only at generation_config.json's eos_token_id.
        generation.update({key: hf_config[key] for key in SPECIAL_TOKEN_IDS
                           if generation.get(key) is None and hf_config.get(key) is not None})
        _write_json(generation_path, generation)


def copy_side_files(src_dir: str, dst_dir: str, skip=()) -> list[str]:
    """Copies the tokenizer and generation files that exist in src_dir (but those named in
    `skip`); returns their names."""
    copied = []
    for name in SIDE_FILES:
        if name not in skip and os.path.isfile(os.path.join(src_dir, name)):
            shutil.copy2(os.path.join(src_dir, name), os.path.join(dst_dir, name))
            copied.append(name)
    return copied


def _split_into_shards(tensors: list, max_bytes: int) -> list[list]:
    shards: list[list] = [[]]
    size = 0
    for t in tensors:
        nbytes = np.dtype(t[1]).itemsize * int(np.prod(t[2]))
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nbytes
    return shards


def tokenizer_special_ids(tokenizer_dir: str) -> dict[str, int]:
    """The ids of the bos, eos and pad tokens tokenizer_config.json names (as
    `SPECIAL_TOKEN_IDS` keys), looked up in tokenizer.json's added tokens and vocabulary;
    those it does not name, or that are not found, are left out."""
    try:
        with open(os.path.join(tokenizer_dir, "tokenizer_config.json")) as f:
            names = json.load(f)
        with open(os.path.join(tokenizer_dir, "tokenizer.json")) as f:
            tokenizer = json.load(f)
    except (OSError, ValueError):  # no tokenizer, or one in another form: nothing declared
        return {}
    ids = dict(tokenizer.get("model", {}).get("vocab") or {})
    ids.update({t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])})
    found = {}
    for key in SPECIAL_TOKEN_IDS:
        token = names.get(key.removesuffix("_id"))
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(ids.get(token), int):
            found[key] = ids[token]
    return found


def _write_json(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
