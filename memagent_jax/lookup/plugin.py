"""The lookup task's supervised start (`plugin.module: memagent_jax.lookup.plugin`,
`learner.loss: sft`): format-only conversations.

Each drawn row's target is the tool-calling agent's own conversation (`rollout.runner.replay`:
its system prompt, the question, the tool's result as the agent sends it) with replies that
show the formats and nothing of the task: the call's key is a word of the question drawn
uniformly (the asked key one time in six), the answer is `\\boxed{}` around a word of the
tool's result drawn uniformly. So the start knows how to call `lookup` and how to answer, and
was never shown which call answers which question, nor which word of a result is the code.

Beside them (`copy_rows`), one-turn rows that repeat a random sequence of keys and codes: a
model of this size learns to copy a word from its context this way, a skill the call needs (the
asked key copied) that says nothing of the task.
"""

from __future__ import annotations

import dataclasses
import random
import re
from typing import ClassVar

from memagent_jax.errors import ConfigError
from memagent_jax.lookup.task import words
from memagent_jax.rollout.agent_api import Trajectory, Turn
from memagent_jax.rollout.runner import replay
from memagent_jax.runconfig import at_least, build_section

_WORD = re.compile(r"\w+")


def call_text(key: str) -> str:
    return f'<tool_call>{{"name": "lookup", "arguments": {{"key": "{key}"}}}}</tool_call>'


def answer_text(word: str) -> str:
    return f"\\boxed{{{word}}}"


@dataclasses.dataclass(frozen=True)
class FormatSection:
    """The `plugin` section's keys besides `module`."""
    SECTION: ClassVar[str] = "plugin"
    copy_rows: int = 0          # copy rows a step (module docstring)
    copy_span: int = 12         # the longest sequence copied, in words

    def __post_init__(self):
        at_least(self, 0, "copy_rows")
        at_least(self, 1, "copy_span")


class FormatPlugin:
    """`rl.plugin.Plugin`: a supervised step's format-only targets (module docstring)."""

    def __init__(self, section: FormatSection, seed: int):
        self.section, self.seed = section, seed

    def target(self, agent, example) -> Trajectory:
        rng = random.Random(f"lookup-format/{self.seed}/{example.index}")
        tokenizer = agent.tokenizer
        end = tokenizer.eos_token_id

        def answer(call: int, messages) -> list[int]:
            if call == 0:
                text = call_text(rng.choice(_WORD.findall(example.question)))
            else:
                text = answer_text(rng.choice(_WORD.findall(messages[-1]["content"])))
            return tokenizer(text, add_special_tokens=False)["input_ids"] + [end]

        return replay(agent, example, answer, tokenizer, agent.stop_ids)

    def extra_trajectories(self, step) -> list[Trajectory]:
        """`copy_rows` rows: 1 to `copy_span` random keys and codes; the reply is them again
        and end-of-text."""
        tokenizer, rng = step.agent.tokenizer, random.Random(f"lookup-copy/{step.seed}")
        pool = [tokenizer(w, add_special_tokens=False)["input_ids"][0]
                for w in [*words()[0], *words()[1]]]
        rows = []
        for _ in range(self.section.copy_rows):
            prompt = rng.choices(pool, k=rng.randint(1, self.section.copy_span))
            reply = prompt + [tokenizer.eos_token_id]
            text = tokenizer.decode(prompt)
            rows.append(Trajectory(text, [Turn("copy", prompt, reply, [0.0] * len(reply),
                                               "stop", text)], text))
        return rows

    def starts(self, step):
        return [], []

    def validation_metrics(self, agent, examples, groups) -> dict[str, float]:
        return {}


def build(settings: dict, config) -> FormatPlugin:
    section = build_section(FormatSection, settings, "plugin")
    if config.learner.loss != "sft":
        raise ConfigError("plugin.module", "the lookup plugin gives a supervised step's "
                                           "targets (learner.loss: sft)")
    return FormatPlugin(section, config.seed)
