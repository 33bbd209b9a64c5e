"""A plugin that is not the synthetic one (rl/plugin.py's contract, exercised by
tests/rl/test_plugin.py): the target answers each question in one final turn, the extra rows
repeat the first drawn question's target, and a start reads one chunk from a given memory,
which the step's own policy has read first (`StepContext.rollouts`, greedy; kept in `rolled`);
a validation read adds the number of its trajectories and of their turns (what it was given
kept in `validated`)."""

import dataclasses
from typing import ClassVar

from memagent_jax.agents.memagent.reading import Sample
from memagent_jax.data.pipeline import Example
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.rollout.agent_api import Trajectory, Turn
from memagent_jax.runconfig import build_section


@dataclasses.dataclass(frozen=True)
class Section:
    SECTION: ClassVar[str] = "plugin"
    extra: int = 0              # extra rows a supervised step trains on
    starts: int = 0             # prompts a DAPO step starts from a given memory


class Plugin:
    def __init__(self, section: Section):
        self.section, self.seeds, self.rolled, self.validated = section, [], [], []

    def target(self, agent, example: Example) -> Trajectory:
        sample = agent.read(example.question, example.context, strict=False)
        reply = agent.tokenizer(example.ground_truths[0], add_special_tokens=False)["input_ids"]
        prompt = agent.prompts.final(sample.problem_ids, agent.prompts.initial_memory)
        end = agent.tokenizer.eos_token_id
        return Trajectory(example.question, [Turn("final", prompt, [*reply, end],
                                                  [0.0] * (len(reply) + 1), "stop",
                                                  example.ground_truths[0])],
                          example.ground_truths[0])

    def extra_trajectories(self, step) -> list[Trajectory]:
        self.seeds.append(step.seed)
        example = Example(-1, "needle", "what is the secret code ?", "", ("tiger",))
        return [self.target(step.agent, example) for _ in range(self.section.extra)]

    def starts(self, step) -> tuple[list[Example], list[Sample]]:
        tokenizer = step.agent.tokenizer
        examples, samples = [], []
        for i in range(self.section.starts):
            memory = tuple(tokenizer("the secret code is tiger .",
                                     add_special_tokens=False)["input_ids"])
            sample = step.agent.read("what is the secret code ?", "the river runs past an apple .",
                                     strict=False)
            examples.append(Example(-1 - i, "needle", sample.problem, "", ("tiger",)))
            samples.append(dataclasses.replace(sample, initial_memory=memory))
        self.rolled.append((samples, [group[0] for group in step.rollouts.run(
            step.agent, samples, SamplingParams(0.0), on_call=step.on_call)]))
        return examples, samples

    def validation_metrics(self, agent, examples: list[Example],
                           groups: list[list[Trajectory]]) -> dict[str, float]:
        self.validated.append((examples, groups))
        return {"trajectories": float(sum(map(len, groups))),
                "turns": float(sum(len(t.turns) for g in groups for t in g))}


def build(settings: dict, config) -> Plugin:
    return Plugin(build_section(Section, settings, "plugin"))
