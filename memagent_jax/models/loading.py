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
from memagent_jax.models.lora import Adapters, abstract_adapters, merge_peft, merged
from memagent_jax.models.lora_config import LoraConfig
from memagent_jax.models.presets import preset_config
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
    if model_dir.is_checkpoint_directory(path) and checkpoint.lora_record(path) is not None:
        return _load_lora_run(path, dtype, mesh, param_dtype, attention, lora)
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


def read_run_adapters(path: str, mesh: jax.sharding.Mesh | None = None
                      ) -> tuple[ModelConfig, LoraConfig, Adapters, dict]:
    """A LoRA training run's checkpoint (any path naming one): (the model's config, the
    adapters' LoraConfig, the adapters, float32 on `mesh`, its lora.json record)."""
    record = checkpoint.lora_record(path)
    if record is None:
        raise UserError(f"{path}: not a LoRA training run's checkpoint")
    config = read_config(path).replace(dtype=record["dtype"])
    lora_config = LoraConfig(rank=record["rank"], alpha=record["alpha"],
                             targets=tuple(record["targets"]))
    adapters = checkpoint.read_params(path, config,
                                      abstract_adapters(config, lora_config, mesh))
    return config, lora_config, adapters, record


def read_run_base(path: str, record: dict, mesh: jax.sharding.Mesh | None = None) -> Params:
    """The base a LoRA run's record names, stored as the run stored it, checked against the
    record's fingerprint (other weights at that path are a UserError)."""
    name = checkpoint.base_name(record)
    if record["path"] is not None:
        base_path = model_dir.resolve(record["path"])
        if not is_model_directory(base_path):
            raise UserError(f"{path}: the base of its LoRA adapters, {base_path}, is not a "
                            "model directory")
        model, _ = load_model(base_path, dtype=record["dtype"], mesh=mesh,
                              lora=record["merged_adapter"])
    else:
        model, _ = preset_model(record["preset"], record["init_seed"], record["dtype"],
                                mesh=mesh, lora=record["merged_adapter"])
    params = split_params(model)[1]
    found = checkpoint.weights_fingerprint(params)
    if found != record["fingerprint"]:
        raise UserError(f"{path}: its LoRA adapters were trained on {name} with weights "
                        f"{record['fingerprint']}, and those weights are now {found}: "
                        "restore the base they were trained on")
    return params


def _load_lora_run(path: str, dtype: str | None, mesh, param_dtype: str | None,
                   attention: str, lora: str | None) -> tuple[Qwen, ModelConfig]:
    """`load_model` of a LoRA run's checkpoint: its base with its adapters merged in."""
    config, lora_config, adapters, record = read_run_adapters(path, mesh)
    base = read_run_base(path, record, mesh)
    param_dtype = _dtype_name(param_dtype or dtype or record["dtype"], path)
    config = config.replace(dtype=param_dtype)
    params = merged(base, adapters, lora_config.scale, param_dtype)
    if lora is not None:
        params = merge_peft(params, config, lora)
    return build_model(config, params, dtype=_dtype_name(dtype or param_dtype, path),
                       attention=attention), config


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


def preset_model(preset: str, seed: int, param_dtype: str, dtype: str | None = None,
                 attention: str = "xla", mesh: jax.sharding.Mesh | None = None,
                 lora: str | None = None) -> tuple[Qwen, ModelConfig]:
    """A preset's random model (`random_model` of seed `seed`) stored in param_dtype,
    computing in dtype (None: param_dtype), with the PEFT adapter `lora` merged in."""
    config = preset_config(preset, dtype=param_dtype)
    dtype = dtype or param_dtype
    model = random_model(config, seed=seed, dtype=dtype, attention=attention, mesh=mesh)
    if lora is not None:
        model = build_model(config, merge_peft(split_params(model)[1], config, lora),
                            dtype=dtype, attention=attention)
    return model, config


def _dtype_name(dtype: str, source: str) -> str:
    if dtype not in _DTYPES:
        raise UserError(f"{source}: unsupported dtype '{dtype}' "
                        f"(choose from: {', '.join(_DTYPES)})")
    return dtype
