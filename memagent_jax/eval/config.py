"""The schema of `memagent-jax eval --config FILE [key=value ...]`, read by `runconfig`.

Sections and what they change:
- model: which weights (`engine.factory.ModelSection`, shared with train); `name` labels the row
  of the results table. `url`: run the memory agent's turns on an OpenAI-compatible server
  instead (`memagent-jax serve`, vLLM; key in env MEMAGENT_API_KEY, else
  API_KEY), as `run --url` does; `path` is
  then only read for the tokenizer, and `served_name` is the model name sent.
- method: "memagent" (the chunk-memory loop), "full_context" (the whole document in one
  prompt, centre-truncated to the model window: the baseline of the paper's table), or
  "agent": the `agent` section's agent (rollout/agent_api.py: `{module: ..., its own keys}`)
  on each record as a data row, its final answer scored.
- memagent: the memory agent's token budgets and `thinking` (`MemAgentConfig`, shared with train
  and `run`);
  full_context: the baseline's window and reply length.
- sampling: n answers per question at temperature/top_p (the paper: n=1, 0.7, 0.95).
- engine: decode slots, KV length (default: what the method needs), prefill buckets
  (`EngineConfig`, shared with train); mesh: the device mesh (None: one device).
- data: the evaluation set files, one per context length (`memagent-jax data ...` writes them).
- output_dir: per-sample JSONL, summary table and plot; a rerun resumes there.
- report: published curves (docs/algorithm.md section 5) and other runs' rows to compare with.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, ClassVar, Literal

from memagent_jax.agents.memagent.config import MemAgentConfig
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.model_section import ModelSection
from memagent_jax.errors import ConfigError
from memagent_jax.rollout.agent_api import load_agent
from memagent_jax.runconfig import at_least, probability


@dataclasses.dataclass
class EvalModelSection(ModelSection):
    name: str | None = None             # row label (default: the directory's or preset's name)
    url: str | None = None              # a server's API base, ".../v1" (None: the local engine)
    served_name: str | None = None      # the model name sent to url (default: path's last part)


@dataclasses.dataclass
class FullContextSection:
    max_input_tokens: int | None = None  # prompt window; None: the model's context length
    max_new_tokens: int = 1024            # minus max_new_tokens and the template
    SECTION: ClassVar[str] = "full_context"

    def __post_init__(self):
        at_least(self, 1, "max_new_tokens", "max_input_tokens")


@dataclasses.dataclass
class SamplingSection:
    temperature: float = 0.7    # 0 is greedy
    top_p: float = 0.95         # nucleus sampling (1: off)
    top_k: int = 0              # top-k sampling (0: off)
    n: int = 1                  # answers per question; a question's score is their mean
    seed: int = 0               # with the set and row, seeds each question's sampling
    SECTION: ClassVar[str] = "sampling"

    def __post_init__(self):
        if self.temperature < 0:
            raise ConfigError("sampling.temperature", f"must be >= 0 (0 is greedy), got "
                                                      f"{self.temperature}")
        probability(self, "top_p")
        at_least(self, 0, "top_k")
        at_least(self, 1, "n")


@dataclasses.dataclass
class DataSection:
    sets: list[str] = dataclasses.field(default_factory=list)  # one file per length
    max_samples: int | None = None  # the first k samples of each set (None: all)
    # Questions in flight together. Each keeps every turn's token ids until it finishes,
    # so this bounds host memory on million-token documents.
    batch_size: int = 32
    SECTION: ClassVar[str] = "data"

    def __post_init__(self):
        self.sets = [os.path.expanduser(p) for p in self.sets]
        at_least(self, 1, "batch_size", "max_samples")


@dataclasses.dataclass
class ReportSection:
    published: bool = True   # overlay docs/algorithm.md section 5's curves (RULER-HQA)
    compare: list[str] = dataclasses.field(default_factory=list)  # other eval output dirs


@dataclasses.dataclass
class EvalConfig:
    COMMAND: ClassVar[str] = "eval"
    # Top-level keys of train configs only: such a file given to eval is named as one.
    OTHER_CONFIGS: ClassVar[dict] = {"train": ("rollout", "learner", "steps", "prompts_per_step",
                                               "validation", "checkpoint", "dynamic_sampling",
                                               "overlong", "plugin")}
    model: EvalModelSection = dataclasses.field(default_factory=EvalModelSection)
    method: Literal["memagent", "full_context", "agent"] = "memagent"
    # method agent's agent: {module: ..., its own keys} (rollout/agent_api.py).
    agent: dict[str, Any] = dataclasses.field(default_factory=dict)
    memagent: MemAgentConfig = dataclasses.field(default_factory=MemAgentConfig)
    full_context: FullContextSection = dataclasses.field(default_factory=FullContextSection)
    sampling: SamplingSection = dataclasses.field(default_factory=SamplingSection)
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    mesh: dict[str, int] | None = None   # e.g. {fsdp: -1}; None: one device
    data: DataSection = dataclasses.field(default_factory=DataSection)
    output_dir: str = ""
    report: ReportSection = dataclasses.field(default_factory=ReportSection)

    def __post_init__(self):
        self.output_dir = os.path.expanduser(self.output_dir)
        missing = [key for key, value in (("data.sets", self.data.sets),
                                          ("output_dir", self.output_dir)) if not value]
        if missing:
            raise ConfigError("", f"required key{'s' if len(missing) > 1 else ''} missing: "
                                  f"{', '.join(missing)}")
        if self.model.url and self.model.lora:
            raise ConfigError("model.lora", "the server at model.url serves its own weights: "
                                            "give the adapter to its `serve --lora`")
        if self.model.url and self.method == "full_context":
            raise ConfigError("model.url", "a server runs methods memagent and agent "
                                           "(full_context needs the local engine)")
        if (self.method == "agent") != bool(self.agent):
            raise ConfigError("agent" if self.agent else "method",
                              "method agent runs the agent section's agent: give both "
                              "(MemAgent is method memagent)")
        self._agent = load_agent(self.agent, self) if self.agent else None

    @property
    def loaded_agent(self):
        """method agent's agent, built when this config was (None for the other methods)."""
        return self._agent

    @property
    def row_name(self) -> str:
        return (self.model.name or self.model.preset
                or os.path.basename(os.path.normpath(self.model.path or "")))

    def identity(self) -> dict:
        """The settings a run's results depend on: a resumed run must match them.
        `memagent.thinking` is named only when it is not "keep" (full_context reads it too),
        so runs from before the setting existed resume under its default."""
        sections: dict[str, MemAgentConfig | FullContextSection] = {
            "memagent": self.memagent, "full_context": self.full_context}
        method = sections.get(self.method)
        settings = dataclasses.asdict(method) if method is not None else dict(self.agent)
        settings.pop("thinking", None)
        thinking = self.memagent.thinking
        return {"model.path": (self.model.path or f"preset {self.model.preset}, seed "
                                                  f"{self.model.init_seed}"),
                "model.compute_dtype": self.model.compute_dtype,
                "model.param_dtype": self.model.param_dtype,
                "method": self.method, self.method: settings,
                "sampling": dataclasses.asdict(self.sampling),
                **({"memagent.thinking": thinking} if thinking != "keep" else {}),
                **({"model.lora": self.model.lora} if self.model.lora else {}),
                **({"model.url": self.model.url} if self.model.url else {})}
