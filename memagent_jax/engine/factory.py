"""Where every front end gets its model and its engine: `load_model_section`, `build_engine`.

`run`, `generate`, `serve`, `eval` and `train` load a model with `load_model_section` (the
`model` section of their config, or their flags: a `LoadedModel`) and assemble the engine with
`build_engine` (`rollout.runner.build_runner` does so for an agent, the engine sized for the
longest conversation the agent says it makes). Every engine is checked against the model's
window and the devices' memory before it allocates (`sizing`). Nothing else builds an agent's
engine; only engine-level tests and benchmarks build an `Engine` directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax

from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.model_section import ModelSection
from memagent_jax.engine.sizing import check_memory, check_window
from memagent_jax.errors import ConfigError
from memagent_jax.models.config import ModelConfig
from memagent_jax.models.loading import load_model, preset_model
from memagent_jax.models.qwen import Params, Qwen, split_params
from memagent_jax.tokenizer import rows_needed, stop_token_ids

if TYPE_CHECKING:  # the engine (and its kernels) load when one is built, not with a config
    from memagent_jax.engine.engine import Engine


class LoadedModel(NamedTuple):
    """A loaded model: its module (parameters on the mesh), config, tokenizer (None without
    tokenizer files) and stop ids (the model directory's EOS ids, else the tokenizer's)."""
    model: Qwen
    config: ModelConfig
    tokenizer: object
    stop_ids: tuple[int, ...]

    @property
    def params(self) -> Params:
        """The model's parameters, as the engine and the learner take them."""
        return split_params(self.model)[1]


def default_dtype() -> str:
    """float32 on CPU (XLA:CPU's bf16 matmuls at decode shapes are several times slower than
    its f32 ones; BENCHMARKS.md, "Kernel choices on XLA:CPU"), bfloat16 on GPU/TPU."""
    return "float32" if jax.default_backend() == "cpu" else "bfloat16"


def load_model_section(section: ModelSection, tokenizer,
                       mesh: jax.sharding.Mesh | None = None) -> LoadedModel:
    """Loads the section's weights (or the preset's random ones) onto `mesh` (None: one
    device), stored in its param_dtype, computing in its compute_dtype, with the section's
    LoRA adapter merged in; `tokenizer` is what `section.load_tokenizer` gave."""
    compute = section.compute_dtype or default_dtype()
    stored = section.param_dtype or compute
    if section.path is not None:
        model, config = load_model(section.path, dtype=compute, param_dtype=stored, mesh=mesh,
                                   attention=section.attention, lora=section.lora)
        stops = stop_token_ids(section.path, config.extra.get("eos_token_id"))
    else:
        assert section.preset is not None  # exactly one of path and preset (__post_init__)
        model, config = preset_model(section.preset, section.init_seed, stored, compute,
                                     section.attention, mesh, section.lora)
        stops = ()
    if tokenizer is not None:
        if rows_needed(tokenizer) > config.vocab_size:
            raise ConfigError("model.tokenizer", f"{rows_needed(tokenizer)} tokens do not fit "
                                                 f"the model's {config.vocab_size} embedding rows")
        if not stops and tokenizer.eos_token_id is not None:
            stops = (int(tokenizer.eos_token_id),)
    return LoadedModel(model, config, tokenizer, stops)


def build_engine(model: Qwen, config: EngineConfig, mesh: jax.sharding.Mesh | None,
                 tokens: int, key: str = "engine.max_len", why: str | None = None) -> Engine:
    """An engine for `model`, with max_len `kv_length(tokens)` unless the config sets it,
    checked against the model's context window and the devices' memory before anything is
    allocated (`sizing`). A size that does not fit is a ConfigError naming `key`, the setting
    that asks for `tokens` (`why`: its value and how it makes them; default `tokens`), or
    engine.max_len where the config sets it."""
    if config.max_len is not None:
        tokens, key, why = config.max_len, "engine.max_len", None
    from memagent_jax.engine.engine import Engine

    why = why or str(tokens)
    check_window(model.config, tokens, key, why)
    engine = Engine(model, config.sized_for(tokens), mesh=mesh)
    check_memory(engine, key, why)
    return engine
