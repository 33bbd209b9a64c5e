"""Where every front end gets its policy and its agents' engine: `load_policy`, `build_engine`,
`build_runner`, `build_agent`.

`run`, `generate`, `eval` and `train` load a model with `load_policy` (the `model` section of
their config, or their flags) and assemble the engine with `build_engine`; `build_runner` puts
engine, scheduler and `AgentRunner` together for an agent (rollout/agent_api.py), the engine
sized for the longest conversation the agent says it makes; `build_agent` does so for MemAgent
and returns a `MemoryAgent` (benchmarks/memory_loop.py uses it too). Every engine is checked
against the model's window and the devices' memory before it allocates (`sizing`). Nothing
else builds an agent's engine; only engine-level tests and benchmarks build an `Engine`
directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax

from memagent_jax.errors import ConfigError
from memagent_jax.models.config import ModelConfig
from memagent_jax.models.loading import load_model, random_model
from memagent_jax.models.presets import preset_config
from memagent_jax.models.qwen import Params, Qwen, split_params
from memagent_jax.rollout.engine_api import EngineConfig
from memagent_jax.rollout.memagent import MemAgent, MemAgentConfig, MemoryAgent, Sample
from memagent_jax.rollout.model_section import ModelSection
from memagent_jax.rollout.runner import AgentRunner
from memagent_jax.rollout.scheduler import Scheduler
from memagent_jax.rollout.sizing import check_memory, check_window
from memagent_jax.tokenizer import rows_needed, stop_token_ids

if TYPE_CHECKING:  # the engine (and its kernels) load when one is built, not with a config
    from memagent_jax.rollout.engine import Engine


class Policy(NamedTuple):
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


def load_policy(section: ModelSection, tokenizer, mesh: jax.sharding.Mesh | None = None
                ) -> Policy:
    """Loads the section's weights (or the preset's random ones) onto `mesh` (None: one
    device), stored in its param_dtype, computing in its compute_dtype; `tokenizer` is what
    `section.load_tokenizer` gave."""
    compute = section.compute_dtype or default_dtype()
    stored = section.param_dtype or compute
    if section.path is not None:
        model, config = load_model(section.path, dtype=compute, param_dtype=stored, mesh=mesh,
                                   attention=section.attention)
        stops = stop_token_ids(section.path, config.extra.get("eos_token_id"))
    else:
        config = preset_config(section.preset, dtype=stored)
        model = random_model(config, seed=section.init_seed, dtype=compute,
                             attention=section.attention, mesh=mesh)
        stops = ()
    if tokenizer is not None:
        if rows_needed(tokenizer) > config.vocab_size:
            raise ConfigError("model.tokenizer", f"{rows_needed(tokenizer)} tokens do not fit "
                                                 f"the model's {config.vocab_size} embedding rows")
        if not stops and tokenizer.eos_token_id is not None:
            stops = (int(tokenizer.eos_token_id),)
    return Policy(model, config, tokenizer, stops)


def build_engine(model: Qwen, config: EngineConfig, mesh: jax.sharding.Mesh | None,
                 tokens: int, key: str = "engine.max_len", why: str | None = None) -> Engine:
    """An engine for `model`, with max_len `kv_length(tokens)` unless the config sets it,
    checked against the model's context window and the devices' memory before anything is
    allocated (`sizing`). A size that does not fit is a ConfigError naming `key`, the setting
    that asks for `tokens` (`why`: its value and how it makes them; default `tokens`), or
    engine.max_len where the config sets it."""
    if config.max_len is not None:
        tokens, key, why = config.max_len, "engine.max_len", None
    from memagent_jax.rollout.engine import Engine

    why = why or str(tokens)
    check_window(model.config, tokens, key, why)
    engine = Engine(model, config.sized_for(tokens), mesh=mesh)
    check_memory(engine, key, why)
    return engine


def build_runner(agent, model: Qwen, tokenizer, engine: EngineConfig,
                 mesh: jax.sharding.Mesh | None, stop_ids: tuple[int, ...]) -> AgentRunner:
    """An AgentRunner for `agent` on its own scheduler and engine, after `agent.setup`; the
    engine sized for the longest conversation the agent makes (`engine_need`) unless
    `engine.max_len` is set."""
    if hasattr(agent, "setup"):
        agent.setup(tokenizer, stop_ids)
    tokens, key, why = engine_need(agent, tokenizer, engine)
    decoder = build_engine(model, engine, mesh, tokens, key, why)
    return AgentRunner(Scheduler(decoder), tokenizer, stop_ids)


def engine_need(agent, tokenizer, engine: EngineConfig) -> tuple[int, str, str]:
    """(KV entries the agent's longest conversation needs, the setting that asks for them, how
    it makes them): the agent's `engine_need(tokenizer)`, else its `max_len(tokenizer)`. An
    agent that says neither is a ConfigError unless `engine.max_len` is set."""
    if hasattr(agent, "engine_need"):
        return agent.engine_need(tokenizer)
    if hasattr(agent, "max_len"):
        tokens = agent.max_len(tokenizer)
        return tokens, "agent", f"{agent.name} makes conversations of up to {tokens} tokens"
    if engine.max_len is None:
        raise ConfigError("engine.max_len", f"agent {agent.name} does not say how long its "
                                            "conversations get (max_len(tokenizer)): set "
                                            "engine.max_len")
    return engine.max_len, "engine.max_len", str(engine.max_len)


def build_agent(model: Qwen, tokenizer, memagent: MemAgentConfig, engine: EngineConfig,
                mesh: jax.sharding.Mesh | None, stop_ids: tuple[int, ...],
                sample: Sample | None = None) -> MemoryAgent:
    """A MemoryAgent on its own scheduler and engine, the engine sized for the longest turn
    `memagent`'s budgets allow, or given `sample` for that sample's turns alone (`run`: a short
    document under a large chunk budget needs no larger cache), by `MemAgent.engine_need`,
    unless `engine.max_len` is set. A turn too long for the model or the devices is a
    ConfigError naming the largest budget; an `engine.max_len` below the turns one naming it,
    before an engine is built."""
    agent = MemAgent(memagent, tokenizer, stop_ids)
    tokens, key, why = agent.engine_need(tokenizer, sample)
    # Before anything is allocated: a turn past the cache could not be decoded. (Another
    # agent's max_len is its caps' sum, an upper bound: `run --agent ... --max-len` may cap it.)
    if engine.max_len is not None and engine.max_len < tokens:
        raise ConfigError("engine.max_len", f"{engine.max_len} is below the agent's longest "
                                            f"turn: {key} {why}")
    decoder = build_engine(model, engine, mesh, tokens, key, why)
    return MemoryAgent(Scheduler(decoder), agent)
