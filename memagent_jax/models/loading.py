"""load_model / save_hf / save_checkpoint: the model's way in and out of files.

A model is built abstractly first (`nnx.eval_shape`: shapes, no memory), then each parameter is
read straight onto its sharding from either format, so loading never allocates the weights twice.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
from flax import nnx

from memagent_jax.errors import UserError
from memagent_jax.models import checkpoint, hf_checkpoint
from memagent_jax.models.config import ModelConfig
from memagent_jax.models.qwen2 import Qwen2, param_specs
from memagent_jax.models.sharding import param_shardings

_DTYPES = ("float32", "bfloat16", "float16")


def load_model(path: str, dtype: str | None = "float32", mesh: jax.sharding.Mesh | None = None,
               param_dtype: str | None = None, attention: str = "xla"
               ) -> tuple[Qwen2, ModelConfig]:
    """Loads an HF directory (config.json + safetensors) or one of our checkpoint directories.

    dtype: compute dtype, and parameter dtype unless `param_dtype` is given; None keeps the
    dtype the weights are stored in. mesh: parameters are placed with `param_shardings`;
    None puts them on the default device. attention: see `qwen2.ATTENTION_IMPLEMENTATIONS`.
    Returns (model, config); config.dtype is the
    parameter dtype of the returned model.
    """
    if not os.path.isdir(path):
        raise UserError(f"{path}: model directory not found")
    if checkpoint.is_checkpoint_directory(path):
        config = ModelConfig.from_file(checkpoint.config_path(path))
    elif hf_checkpoint.is_hf_directory(path):
        config = ModelConfig.from_file(os.path.join(path, "config.json"))
    else:
        raise UserError(f"{os.path.join(path, 'config.json')}: not found (neither an HF model "
                        "directory nor a memagent-jax checkpoint)")
    param_dtype = _dtype_name(param_dtype or dtype or config.dtype, path)
    compute_dtype = _dtype_name(dtype or config.dtype, path)
    config = config.replace(dtype=param_dtype)
    targets = abstract_params(config, mesh)
    if checkpoint.is_checkpoint_directory(path):
        params = checkpoint.read_params(path, nest(targets))
    else:
        params = nest(hf_checkpoint.read_params(path, config, targets))
    return build_model(config, params, dtype=compute_dtype, attention=attention), config


def abstract_params(config: ModelConfig, mesh=None) -> dict[str, jax.ShapeDtypeStruct]:
    """'path' -> ShapeDtypeStruct (parameter dtype = config.dtype, with its sharding)."""
    shardings = (param_shardings(config, mesh) if mesh is not None else None)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return {path: jax.ShapeDtypeStruct(shape, jnp.dtype(config.dtype),
                                       sharding=shardings[path] if shardings else device)
            for path, (shape, _) in param_specs(config).items()}


def build_model(config: ModelConfig, params: dict, dtype: str = "float32",
                attention: str = "xla") -> Qwen2:
    """A Qwen2 module holding the given nested parameter arrays (no random init is run)."""
    abstract = nnx.eval_shape(lambda: Qwen2(config, dtype=dtype, param_dtype=config.dtype,
                                            attention=attention, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state)


def model_params(model: Qwen2) -> dict[str, jax.Array]:
    """'path' -> array of every parameter."""
    return flatten(nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def save_hf(model: Qwen2, config: ModelConfig, out_dir: str, tokenizer_dir: str | None = None,
            max_shard_bytes: int = hf_checkpoint.DEFAULT_MAX_SHARD_BYTES) -> None:
    """Exports an HF directory loadable by `transformers.AutoModelForCausalLM.from_pretrained`,
    in the parameters' dtype; tokenizer/generation files are copied from tokenizer_dir."""
    config = config.replace(dtype=jnp.dtype(model.embed[...].dtype).name)
    hf_checkpoint.write_directory(model_params(model), config, out_dir, tokenizer_dir,
                                  max_shard_bytes)


def save_checkpoint(model: Qwen2, config: ModelConfig, out_dir: str,
                    side_files_dir: str | None = None) -> None:
    """Writes our Orbax checkpoint directory (see `checkpoint.py`)."""
    config = config.replace(dtype=jnp.dtype(model.embed[...].dtype).name)
    checkpoint.write_checkpoint(nnx.to_pure_dict(nnx.state(model, nnx.Param)), config, out_dir,
                                side_files_dir)


def random_model(config: ModelConfig, seed: int = 0, dtype: str = "float32",
                 attention: str = "xla") -> Qwen2:
    """A model with random weights (norms 1, the rest N(0, 0.02)) stored as config.dtype."""
    return Qwen2(config, dtype=dtype, param_dtype=config.dtype, attention=attention,
                 rngs=nnx.Rngs(seed))


def nest(flat: dict[str, object]) -> dict:
    """{'a/b': x} -> {'a': {'b': x}}."""
    tree: dict = {}
    for path, leaf in flat.items():
        *parents, name = path.split("/")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[name] = leaf
    return tree


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    """{'a': {'b': x}} -> {'a/b': x}."""
    flat = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, path + "/"))
        else:
            flat[path] = value
    return flat


def _dtype_name(dtype: str, source: str) -> str:
    if dtype not in _DTYPES:
        raise UserError(f"{source}: unsupported dtype '{dtype}' (choose from: {', '.join(_DTYPES)})")
    return dtype
