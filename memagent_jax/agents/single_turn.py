"""A single-turn agent (`agent: {module: memagent_jax.agents.single_turn}`): the row's prompt
messages, one reply, scored as the final answer: plain DAPO/GRPO on prompt -> answer (the
original's `recurrent/impls/async_trival.py`)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from memagent_jax.runconfig import at_least, build_section


@dataclasses.dataclass(frozen=True)
class SingleTurnSection:
    """The `agent` section's keys besides `module`."""
    SECTION: ClassVar[str] = "agent"
    max_tokens: int = 1024          # the reply's cap
    max_prompt_tokens: int = 1024   # the longest prompt (chat template included) it takes

    def __post_init__(self):
        at_least(self, 1, "max_tokens", "max_prompt_tokens")


class SingleTurn:
    """The agent (module docstring)."""
    name = "single_turn"

    def __init__(self, section: SingleTurnSection):
        self.section = section

    def max_len(self, tokenizer) -> int:
        return self.section.max_prompt_tokens + self.section.max_tokens

    async def rollout(self, row, policy):
        messages = list(row.prompt)
        reply = await policy.chat(messages, max_tokens=self.section.max_tokens)
        return [messages + [reply.message]]


def build(settings: dict, config) -> SingleTurn:
    return SingleTurn(build_section(SingleTurnSection, settings, "agent"))
