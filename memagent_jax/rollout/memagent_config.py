"""MemAgent's settings: the `memagent` section of the train and eval configs (and `run`'s
flags), read without the agent, its runner or JAX (a config is plain data; the agent is
built from it by `memagent.build`)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from memagent_jax import model_dir
from memagent_jax.errors import ConfigError
from memagent_jax.rollout.templates import GATE_WORDS
from memagent_jax.rollout.thinking import THINKING_CHOICES
from memagent_jax.runconfig import at_least, config_key


@dataclasses.dataclass(frozen=True)
class MemAgentConfig:
    """The `memagent` section of the train and eval configs (and `run`'s flags): the token
    budgets of docs/algorithm.md section 1, and what a thinking model's thinking does."""
    SECTION: ClassVar[str] = "memagent"
    chunk_tokens: int = 5000        # document tokens read per turn
    max_memory_tokens: int = 1024   # the longest memory an update turn may write
    max_final_tokens: int = 1024    # the longest final answer
    max_problem_tokens: int = 1024  # the question's tokens kept
    max_chunks: int | None = None   # keep the first and last halves of N chunks (None: all)
    # A thinking model's <think>...</think> (Qwen3; docs/algorithm.md section 7, item 11):
    # keep: the chat template as shipped; a reply's ids (minus stop, EOS, pad) are the next
    #   memory, thinking included (the original's trainer);
    # strip: the template as shipped; the memory is the reply after its last </think>,
    #   stripped of surrounding whitespace (empty if nothing follows it), a reply without one
    #   whole (the original's evaluation);
    # off: the template rendered with enable_thinking=False (an empty think block in every
    #   prompt; `run --url` sends it as chat_template_kwargs); the memory as in keep.
    # The final answer (after the last </think>) and the reward are the same in all three; a
    # model that never writes </think> (Qwen2.5) gets identical prompts and memories.
    thinking: Literal["keep", "strip", "off"] = "keep"
    # Gates (GRU-Mem's update and exit gates, as one-word replies; templates.update_prompt
    # names them): an update reply that is only "keep" leaves the memory as it was; only
    # "exit" stops reading, and the final turn answers from the memory as it was. Off, the
    # prompts and turns are the original's.
    keep_gate: bool = False
    exit_gate: bool = False

    def __post_init__(self):
        at_least(self, 1, "chunk_tokens", "max_memory_tokens", "max_final_tokens",
                 "max_problem_tokens", "max_chunks")
        if self.thinking not in THINKING_CHOICES:
            raise ConfigError(config_key(self, "thinking"), f"must be one of "
                              f"{', '.join(THINKING_CHOICES)}, got {self.thinking!r}")

    @classmethod
    def from_model(cls, model_path: str | None, **given) -> MemAgentConfig:
        """The budgets a model was trained with (its directory's memagent.json, as `run` and
        `demo` read it; a shipped model's name is taken), with those `given` (None: not given)
        over them, and the defaults above for the rest."""
        return cls(**model_dir.budgets(model_path, **given))

    @property
    def gates(self) -> tuple[str, ...]:
        """The gates on, of templates.GATE_WORDS."""
        return tuple(g for g, on in zip(GATE_WORDS, (self.keep_gate, self.exit_gate)) if on)
