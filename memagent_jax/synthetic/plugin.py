"""The synthetic tasks' plugin (`plugin.module: memagent_jax.synthetic.plugin`).

It implements `rl.plugin.Plugin`: a supervised step trains on each drawn row's oracle
trajectory (oracle.py), or with `target: format` its format-only one (format_rows.py), or with
`target: format_all_facts` the format-only one whose final memory holds every fact alike
(format_all_facts.py), and on the extra rows its section asks for (rows.py); a DAPO step rolls
out `carry_starts` prompts that start inside a long document (carry_starts.py), from the
oracle's memory or, with `carry_from: policy`, from the memory the current policy writes there;
a validation read of the tasks' documents adds the per-turn rate at which memories lose a
needed fact (`validation_metrics`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from memagent_jax.agents.memagent.agent import MemAgent, memories_of
from memagent_jax.agents.memagent.reading import Sample
from memagent_jax.data.pipeline import Example
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.errors import ConfigError
from memagent_jax.rl.plugin import StepContext
from memagent_jax.rollout.agent_api import Trajectory
from memagent_jax.runconfig import at_least, build_section
from memagent_jax.synthetic import rows
from memagent_jax.synthetic.carry_starts import carry_starts, policy_carry_starts
from memagent_jax.synthetic.format_all_facts import format_all_facts_trajectory
from memagent_jax.synthetic.format_rows import format_trajectory
from memagent_jax.synthetic.oracle import oracle_trajectory
from memagent_jax.synthetic.tasks import TASKS, sample_of
from memagent_jax.synthetic.trace import trace_document

_SUPERVISED = ("copy_rows", "recall_rows", "fact_rows", "carry_rows")


@dataclasses.dataclass(frozen=True)
class PluginSection:
    """The `plugin` section's keys besides `module` (rows: per supervised step)."""
    SECTION: ClassVar[str] = "plugin"
    # What a drawn row trains on (module docstring).
    target: Literal["oracle", "format", "format_all_facts"] = "oracle"
    # format_all_facts only (format_all_facts.py): the share of update turns, drawn at random,
    # that reply `keep` (memagent.keep_gate on); the final reply restating the needed facts
    # before the box, the box alone, or every fact of the memory then the box.
    keep_share: float = 0.0
    final_reply: Literal["restate", "box", "restate_all"] = "restate"
    copy_rows: int = 0          # rows repeating a random span of words (`rows.copy_trajectories`)
    copy_span: int = 24         # a copied span's longest length, in words
    copy_span_min: int = 1      # a copied span's shortest length
    copy_gap: int = 0           # at most this many random words between a span and its copy
    copy_prefix: int = 0        # at most this many random words before the span
    copy_draw: Literal["log_uniform", "uniform"] = "log_uniform"  # how lengths, gaps are drawn
    recall_rows: int = 0        # rows listing facts and repeating them in another order
    recall_facts: int = 8       # facts per recall row
    fact_rows: int = 0          # update turns at a document's first fact (`rows.fact_trajectories`)
    carry_rows: int = 0         # the hardest carries (`rows.carry_trajectories`)
    carry_pool: int = 16        # candidates drawn per carry row
    carry_cut: bool = False     # carries' chunks cut mid-sentence, as a long document's are
    carry_starts: int = 0       # DAPO prompts per step that start inside a long document
    start_chunks: int = 8       # chunks a carry start reads
    start_pool: int = 16        # candidate chunks drawn per chunk read
    carry_from: Literal["oracle", "policy"] = "oracle"  # whose memory a carry start begins with
    start_task: Literal["any", "multikey", "twohop"] = "any"  # the starts' documents' task

    def __post_init__(self):
        at_least(self, 0, "copy_rows", "copy_gap", "copy_prefix", "recall_rows", "fact_rows",
                 "carry_rows", "carry_starts")
        at_least(self, 1, "copy_span", "copy_span_min", "recall_facts", "carry_pool",
                 "start_chunks", "start_pool")
        if self.copy_span_min > self.copy_span:
            raise ConfigError("plugin.copy_span_min", f"{self.copy_span_min} is above "
                                                      f"copy_span {self.copy_span}")
        if self.carry_cut and not self.carry_rows:
            raise ConfigError("plugin.carry_cut", "cuts the carry rows' chunks: set "
                                                  "plugin.carry_rows too")
        if not 0 <= self.keep_share < 1:
            raise ConfigError("plugin.keep_share", f"must be in [0, 1), got {self.keep_share}")
        for key, default in (("keep_share", 0.0), ("final_reply", "restate")):
            if getattr(self, key) != default and self.target != "format_all_facts":
                raise ConfigError(f"plugin.{key}", "sets the format_all_facts target's rows: "
                                                   "set plugin.target: format_all_facts")
        for key, default in (("carry_from", "oracle"), ("start_task", "any")):
            if getattr(self, key) != default and not self.carry_starts:
                raise ConfigError(f"plugin.{key}", "sets how carry starts begin: set "
                                                   "plugin.carry_starts too")


_TARGETS = {"oracle": oracle_trajectory, "format": format_trajectory}


class SyntheticPlugin:
    """`rl.plugin.Plugin` for the synthetic tasks, as `section` asks."""

    def __init__(self, section: PluginSection, sampling: SamplingParams = SamplingParams()):
        """sampling: the step's rollouts' (the policy's reads of a `carry_from: policy`
        start sample as they do)."""
        self.section, self.sampling = section, sampling
        self._read: dict[tuple, list[str] | None] = {}   # `_chunk_texts`'s, by example

    def target(self, agent: MemAgent, example: Example) -> Trajectory:
        s = self.section
        if s.target == "format_all_facts":
            return format_all_facts_trajectory(agent, example, s.keep_share, s.final_reply)
        return _TARGETS[s.target](agent, example)

    def extra_trajectories(self, step: StepContext) -> list[Trajectory]:
        s, agent, seed = self.section, step.agent, step.seed
        assert isinstance(agent, MemAgent), "the synthetic tasks train MemAgent"
        return (rows.copy_trajectories(agent.tokenizer, s.copy_rows, s.copy_span, seed,
                                       s.copy_span_min, s.copy_gap, s.copy_prefix, s.copy_draw)
                + rows.recall_trajectories(agent.tokenizer, s.recall_rows, s.recall_facts, seed)
                + rows.fact_trajectories(agent, s.fact_rows, seed)
                + (rows.carry_trajectories(agent, s.carry_rows, s.carry_pool, seed,
                                           step.logprobs, s.carry_cut) if s.carry_rows else []))

    def starts(self, step: StepContext) -> tuple[list[Example], list[Sample]]:
        s = self.section
        if not s.carry_starts:
            return [], []
        tasks = TASKS if s.start_task == "any" else (s.start_task,)
        agent = step.agent
        assert isinstance(agent, MemAgent), "the synthetic tasks train MemAgent"
        if s.carry_from == "policy":
            return policy_carry_starts(
                agent, s.carry_starts, s.start_chunks, s.start_pool, seed=step.seed,
                logprobs=step.logprobs, rollouts=step.rollouts,
                sampling=dataclasses.replace(self.sampling, seed=step.seed), tasks=tasks,
                on_call=step.on_call)
        return carry_starts(agent, s.carry_starts, s.start_chunks, s.start_pool,
                            seed=step.seed, logprobs=step.logprobs, tasks=tasks)

    def validation_metrics(self, agent: MemAgent, examples: list[Example],
                           groups: list[list[Trajectory]]) -> dict[str, float]:
        """The needed facts' turns over the read (`trace.losses_by_age`, summed over ages, every
        trajectory and needed fact): `fact_carried_turns`, the turns taken that follow one
        whose memory held a needed fact (none after an exit), and `fact_loss_rate`, the part
        of them whose memory no longer held it; {} when no turn carried one (one-chunk
        documents). examples: the tasks' documents (`tasks.eval_record`'s); one whose read
        leaves a needed fact unread (more chunks than `memagent.max_chunks`) is left out."""
        carried = dropped = 0
        for example, group in zip(examples, groups):
            document = sample_of(example.question, example.context, example.ground_truths[0])
            chunks = self._chunk_texts(agent, example, document)
            if not chunks:  # a needed fact left unread
                continue
            for trajectory in group:
                facts = trace_document(example.index, document, chunks, memories_of(trajectory),
                                       "", agent.config.chunk_tokens).facts
                carried += sum(sum(f.carried) for f in facts)
                dropped += sum(sum(f.dropped) for f in facts)
        return {"fact_carried_turns": float(carried),
                "fact_loss_rate": dropped / carried} if carried else {}

    def _chunk_texts(self, agent: MemAgent, example: Example, document) -> list[str] | None:
        """The chunks `agent` reads of a validation example, as text (kept: a run's validation
        set is fixed); None when they leave out a needed fact."""
        key = (agent.config, example.index, example.context)  # budgets cut the chunks
        if key not in self._read:
            sample = agent.read(example.question, example.context, strict=False)
            texts = [agent.tokenizer.decode(c) for c in sample.chunks]
            read = "".join("".join(texts).split())
            whole = all("".join(f.text.split()) in read for f in document.facts if f.needed)
            self._read[key] = texts if whole else None
        return self._read[key]


def build(settings: dict, config) -> SyntheticPlugin:
    """The plugin from the `plugin` section's keys (`rl.plugin.load`), checked against the
    TrainConfig: supervised rows only with learner.loss sft, carry starts only with dapo."""
    section = build_section(PluginSection, settings, "plugin")
    loss = config.learner.loss
    for key in _SUPERVISED:
        if getattr(section, key) and loss != "sft":
            raise ConfigError(f"plugin.{key}", "these rows are a supervised step's "
                                               "(learner.loss: sft)")
    if section.target != "oracle" and loss != "sft":
        raise ConfigError("plugin.target", "names what a supervised step trains on "
                                           "(learner.loss: sft)")
    if section.keep_share and not config.memagent.keep_gate:
        raise ConfigError("plugin.keep_share", "rows that reply keep need the gate: set "
                                               "memagent.keep_gate: true")
    if section.carry_starts and loss != "dapo":
        raise ConfigError("plugin.carry_starts", "carry starts are rollouts, and a supervised "
                                                 "step samples none; use plugin.carry_rows")
    if section.carry_starts > config.prompts_per_step:
        raise ConfigError("plugin.carry_starts", f"{section.carry_starts} is more than "
                                                 f"prompts_per_step {config.prompts_per_step}")
    rollout = config.rollout
    return SyntheticPlugin(section, SamplingParams(rollout.temperature, rollout.top_p,
                                                   rollout.top_k))
