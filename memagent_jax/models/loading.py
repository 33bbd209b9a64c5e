"""load_model / save_hf / save_checkpoint: the model's way in and out of files.

A model is built abstractly first (`nnx.eval_shape`: shapes, no memory), then each parameter is
read straight onto its sharding from either format, so loading never allocates the weights twice.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from memagent_jax import model_dir
from memagent_jax.errors import UserError
from memagent_jax.models import checkpoint, hf_checkpoint
from memagent_jax.models.config import ModelConfig
from memagent_jax.models.lora import merge_peft
from memagent_jax.models.qwen import Params, Qwen, param_specs, split_params
from memagent_jax.models.sharding import param_shardings

_DTYPES = ("float32", "bfloat16", "float16")


def load_model(path: str, dtype: str | None = "float32", mesh: jax.sharding.Mesh | None = None,
               param_dtype: str | None = None, attention: str = "xla",
               lora: str | None = None) -> tuple[Qwen, ModelConfig]:
    """Loads an HF directory (config.json + safetensors) or one of our checkpoint directories;
    a shipped model's name (`model_dir.shipped_names()`) is its directory, as in every command.

    dtype: compute dtype, and parameter dtype unless `param_dtype` is given; None keeps the
    dtype the weights are stored in. mesh: parameters are placed with `param_shardings`;
    None puts them on the default device. attention: see `qwen.Qwen`. lora: a PEFT LoRA
    adapter directory merged into the weights once they are loaded (`lora.merge_peft`).
    Returns (model, config); config.dtype is the parameter dtype of the returned model.
    """
    path = model_dir.resolve(path)
    config = read_config(path)
    param_dtype = _dtype_name(param_dtype or dtype or config.dtype, path)
    compute_dtype = _dtype_name(dtype or config.dtype, path)
    config = config.replace(dtype=param_dtype)
    targets = abstract_params(config, mesh)
    if model_dir.is_checkpoint_directory(path):
        params = checkpoint.read_params(path, config, targets)
    else:
        params = hf_checkpoint.read_params(path, config, targets)
    if lora is not None:
        params = merge_peft(params, config, lora)
    return build_model(config, params, dtype=compute_dtype, attention=attention), config


def is_model_directory(path: str) -> bool:
    """Whether `path` is a directory `load_model` reads: an HF model (config.json) or one of
    our checkpoints (a converted model, or a training run's step, checkpoints or run dir)."""
    return hf_checkpoint.is_hf_directory(path) or model_dir.is_checkpoint_directory(path)


def read_config(path: str) -> ModelConfig:
    """The config of an HF directory or one of our checkpoints (or a shipped model's name),
    weights untouched."""
    path = model_dir.resolve(path)
    if not os.path.isdir(path):
        raise UserError(f"{path}: model directory not found")
    if model_dir.is_checkpoint_directory(path):
        return ModelConfig.from_file(model_dir.config_path(path))
    if hf_checkpoint.is_hf_directory(path):
        return ModelConfig.from_file(os.path.join(path, "config.json"))
    raise UserError(f"{os.path.join(path, 'config.json')}: not found (neither an HF model "
                    "directory nor a memagent-jax checkpoint)")


def abstract_params(config: ModelConfig, mesh=None) -> Params:
    """Every parameter as a ShapeDtypeStruct (dtype config.dtype) with its sharding: over
    `mesh` (`param_shardings`), or on the default device."""
    return jax.tree.map(lambda sharding, spec: jax.ShapeDtypeStruct(
        spec[0], jnp.dtype(config.dtype), sharding=sharding),
        param_shardings(config, mesh), param_specs(config))


def build_model(config: ModelConfig, params: Params, dtype: str = "float32",
                attention: str = "xla") -> Qwen:
    """A Qwen module holding the given parameter arrays (or ShapeDtypeStructs; no random init
    is run), on the mesh they are sharded on."""
    sharding = getattr(params["embed"], "sharding", None)
    mesh = sharding.mesh if isinstance(sharding, jax.sharding.NamedSharding) else None
    mesh = mesh if isinstance(mesh, jax.sharding.Mesh) else None  # an array's is concrete
    abstract = nnx.eval_shape(lambda: Qwen(config, dtype=dtype, param_dtype=config.dtype,
                                            attention=attention, mesh=mesh, rngs=nnx.Rngs(0)))
    return nnx.merge(nnx.graphdef(abstract), params)


def save_hf(model: Qwen, config: ModelConfig, out_dir: str, tokenizer_dir: str | None = None,
            max_shard_bytes: int = hf_checkpoint.DEFAULT_MAX_SHARD_BYTES,
            poll: Callable[[], None] = lambda: None) -> None:
    """Exports an HF directory loadable by `transformers.AutoModelForCausalLM.from_pretrained`,
    in the parameters' dtype; tokenizer/generation files are copied from tokenizer_dir.
    poll: called before each tensor is written; what it raises stops the export, and nothing
    is left at out_dir."""
    config = config.replace(dtype=jnp.dtype(model.embed[...].dtype).name)
    hf_checkpoint.write_directory(split_params(model)[1], config, out_dir, tokenizer_dir,
                                  max_shard_bytes, poll)


def save_checkpoint(model: Qwen, config: ModelConfig, out_dir: str,
                    side_files_dir: str | None = None) -> None:
    """Writes our Orbax checkpoint directory (see `checkpoint.py`)."""
    config = config.replace(dtype=jnp.dtype(model.embed[...].dtype).name)
    checkpoint.write_checkpoint(split_params(model)[1], config, out_dir, side_files_dir)


def random_model(config: ModelConfig, seed: int = 0, dtype: str = "float32",
                 attention: str = "xla", mesh: jax.sharding.Mesh | None = None) -> Qwen:
    """A model with random weights (norms 1, the rest N(0, 0.02)) stored as config.dtype, on
    `mesh`'s shardings (None: one device)."""
    model = Qwen(config, param_dtype=config.dtype, rngs=nnx.Rngs(seed))
    params = jax.device_put(split_params(model)[1], param_shardings(config, mesh))
    return build_model(config, params, dtype=dtype, attention=attention)


def _dtype_name(dtype: str, source: str) -> str:
    if dtype not in _DTYPES:
        raise UserError(f"{source}: unsupported dtype '{dtype}' "
                        f"(choose from: {', '.join(_DTYPES)})")
    return dtype
