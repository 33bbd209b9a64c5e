"""The schema of `memagent-jax eval --config FILE [key=value ...]`, read by `runconfig`.

Sections and what they change:
- model: which weights; `name` labels the row of the results table.
- method: "memagent" (the chunk-memory loop) or "full_context" (the whole document in one
  prompt, centre-truncated to the model window: the baseline of the paper's table).
- memagent / full_context: that method's token budgets (REFERENCE.md section 1 defaults).
- sampling: n answers per question at temperature/top_p (the paper: n=1, 0.7, 0.95).
- engine: decode slots, KV length (default: what the method needs), device mesh.
- data: the evaluation set files, one per context length (`memagent-jax data ...` writes them).
- output_dir: per-sample JSONL, summary table and plot; a rerun resumes there.
- report: published curves (REFERENCE.md section 5) and other runs' rows to compare with.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Literal


@dataclasses.dataclass
class ModelSection:
    path: str = ""                      # HF or memagent-jax checkpoint directory (required)
    name: str | None = None             # row label (default: the directory's name)
    tokenizer: str | None = None        # tokenizer directory (default: path)
    dtype: Literal["float32", "bfloat16"] | None = None  # None: float32 on CPU, else bf16
    attention: Literal["xla", "dot_product", "cudnn"] = "xla"

    def __post_init__(self):
        self.path = os.path.expanduser(self.path)
        self.tokenizer = self.tokenizer and os.path.expanduser(self.tokenizer)


@dataclasses.dataclass
class MemAgentSection:
    chunk_tokens: int = 5000
    max_memory_tokens: int = 1024
    max_final_tokens: int = 1024
    max_problem_tokens: int = 1024

    def __post_init__(self):
        _positive(self, "chunk_tokens", "max_memory_tokens", "max_final_tokens",
                  "max_problem_tokens")


@dataclasses.dataclass
class FullContextSection:
    max_input_tokens: int | None = None  # prompt window; None: the model's context length
    max_new_tokens: int = 1024            # minus max_new_tokens and the template

    def __post_init__(self):
        _positive(self, "max_new_tokens")
        if self.max_input_tokens is not None:
            _positive(self, "max_input_tokens")


@dataclasses.dataclass
class SamplingSection:
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 0
    n: int = 1       # answers per question; a question's score is their mean
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("temperature must be >= 0, top_p in (0, 1], top_k >= 0; got "
                             f"{self.temperature}, {self.top_p}, {self.top_k}")
        _positive(self, "n")


@dataclasses.dataclass
class EngineSection:
    slots: int = 8
    max_len: int | None = None           # None: what the method needs, rounded up to 256
    mesh: dict[str, int] | None = None   # e.g. {fsdp: -1}; None: one device
    # Prompt lengths compiled for (each one compile); None: the engine's default buckets.
    # The largest must hold the longest prompt.
    prefill_buckets: list[int] | None = None
    prefill_rows: int = 1                # prompts prefilled together in one call

    def __post_init__(self):
        _positive(self, "slots", "prefill_rows")
        if self.prefill_buckets is not None and (not self.prefill_buckets
                                                 or min(self.prefill_buckets) <= 0):
            raise ValueError(f"prefill_buckets must be positive lengths, got "
                             f"{self.prefill_buckets}")


@dataclasses.dataclass
class DataSection:
    sets: list[str] = dataclasses.field(default_factory=list)  # one file per length
    max_samples: int | None = None  # the first k samples of each set (None: all)
    # Questions in flight together. Each keeps every turn's token ids until it finishes,
    # so this bounds host memory on million-token documents.
    batch_size: int = 32

    def __post_init__(self):
        self.sets = [os.path.expanduser(p) for p in self.sets]
        _positive(self, "batch_size")
        if self.max_samples is not None:
            _positive(self, "max_samples")


@dataclasses.dataclass
class ReportSection:
    published: bool = True   # overlay REFERENCE.md section 5's curves (RULER-HQA)
    compare: list[str] = dataclasses.field(default_factory=list)  # other eval output dirs


@dataclasses.dataclass
class EvalConfig:
    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    method: Literal["memagent", "full_context"] = "memagent"
    memagent: MemAgentSection = dataclasses.field(default_factory=MemAgentSection)
    full_context: FullContextSection = dataclasses.field(default_factory=FullContextSection)
    sampling: SamplingSection = dataclasses.field(default_factory=SamplingSection)
    engine: EngineSection = dataclasses.field(default_factory=EngineSection)
    data: DataSection = dataclasses.field(default_factory=DataSection)
    output_dir: str = ""
    report: ReportSection = dataclasses.field(default_factory=ReportSection)

    def __post_init__(self):
        self.output_dir = os.path.expanduser(self.output_dir)
        missing = [key for key, value in (("model.path", self.model.path),
                                          ("data.sets", self.data.sets),
                                          ("output_dir", self.output_dir)) if not value]
        if missing:
            raise ValueError(f"required key{'s' if len(missing) > 1 else ''} missing: "
                             f"{', '.join(missing)}")

    @property
    def row_name(self) -> str:
        return self.model.name or os.path.basename(os.path.normpath(self.model.path))

    def identity(self) -> dict:
        """The settings a run's results depend on: a resumed run must match them."""
        method = self.memagent if self.method == "memagent" else self.full_context
        return {"model.path": self.model.path, "model.dtype": self.model.dtype,
                "method": self.method, self.method: dataclasses.asdict(method),
                "sampling": dataclasses.asdict(self.sampling)}


def _positive(section, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
