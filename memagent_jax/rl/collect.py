"""One step's rollout batch: the agent's rollouts, rewards, overlong shaping, dynamic sampling.

`collect_batch` draws rows from the data iterator, runs n rollouts of the agent per row on the
runner (rollout/runner.py; MemAgent's: every chunk's memory update and the final answer),
scores each trajectory's final reply (`scoring.Rewarder`), adds DAPO's overlong penalty, and,
with dynamic sampling on, keeps only groups whose rewards are not all equal, drawing more rows
until `prompts` groups are kept or the tries run out (docs/algorithm.md section 3); rows the
caller makes itself (a plugin's starts, rl/plugin.py) take the place of drawn ones in the first
round. It returns the kept groups, their shaped rewards [G, n], the indices of every example
drawn (the data order, logged per step), and rollout statistics over every trajectory sampled
(where the caller made rows, the time that took is `time/starts_s`, left out of
`time/rollout_s`: a plugin's own reads are not among the rollout's tokens either).
`supervised_batch` is its counterpart for a supervised step: one given target trajectory per
drawn example.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from memagent_jax.data.pipeline import Example, take
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.rl import dapo
from memagent_jax.rl.scoring import Rewarder
from memagent_jax.rollout.agent_api import Trajectory
from memagent_jax.rollout.rollouts import Limits


@dataclasses.dataclass
class RolloutBatch:
    """examples [G] and groups [G][n]: the kept prompts and their trajectories; rewards [G, n]
    float32: shaped rewards (verifier + overlong penalty); drawn: source indices of every
    example drawn this step, in order; tries: rollout rounds run; stats: scalar statistics."""
    examples: list[Example]
    groups: list[list[Trajectory]]
    rewards: np.ndarray
    drawn: list[int]
    tries: int
    stats: dict[str, float]


def overlong_penalties(groups: list[list[Trajectory]], buffer: int, factor: float
                       ) -> np.ndarray:
    """[G, n] DAPO soft overlong penalties: each reply against its own cap (the max_tokens it
    was asked with; MemAgent's memory updates max_memory_tokens, its answer max_final_tokens),
    with `buffer` tokens of slope (a reply's cap where that is smaller), the trajectory taking
    its worst."""
    out = np.zeros((len(groups), len(groups[0]) if groups else 0), np.float32)
    for g, group in enumerate(groups):
        for j, trajectory in enumerate(group):
            worst = 0.0
            for turn in trajectory.turns:
                for tokens, cap in turn.replies():
                    if cap is not None:
                        worst = min(worst, float(dapo.overlong_penalty(
                            [tokens], cap, min(buffer, cap), factor)[0]))
            out[g, j] = worst
    return out


def collect_batch(runner, agent, params, iterator, config, rewarder: Rewarder,
                  seed_for_try: Callable[[int], int], on_call: Callable | None = None,
                  starts: Callable[[], tuple[list[Example], list]] | None = None
                  ) -> RolloutBatch:
    """One step's batch (module docstring), sampled with `params`. runner: the
    `AgentRunner` the agent's rollouts run on (`with_params(params, fixed_sampling=True)`, as
    training samples); config: the TrainConfig; seed_for_try(k): the
    sampling seed of rollout round k; on_call(row): after every reply. starts(): rows that
    come with their own agent input (`Plugin.starts`: examples to score, and what the agent
    reads), run in the first round in place of as many drawn from `iterator`; later rounds
    draw from `iterator` only."""
    rollout, wanted = config.rollout, config.prompts_per_step
    dynamic = config.dynamic_sampling.enabled
    kept_examples: list = []
    kept_groups: list = []
    kept_rewards: list = []
    drawn: list = []
    all_groups: list = []
    all_raw: list = []
    all_shaped: list = []
    started: Any = []
    tries, start, reward_time, starts_time = 0, time.perf_counter(), 0.0, 0.0
    rollouts = runner.with_params(params, fixed_sampling=True).with_limits(
        Limits(rollout.timeout_s, rollout.max_concurrent))
    while len(kept_groups) < wanted and tries < (config.dynamic_sampling.max_tries
                                                 if dynamic else 1):
        need = wanted - len(kept_groups)
        began = time.perf_counter()
        own_examples, own_rows = starts() if starts and not tries else ([], [])
        starts_time += time.perf_counter() - began
        examples = take(iterator, need - len(own_examples))
        drawn.extend(e.index for e in examples)
        rows = examples + own_rows
        examples = examples + own_examples
        sampling = SamplingParams(rollout.temperature, rollout.top_p, rollout.top_k,
                                  seed=seed_for_try(tries))
        groups = rollouts.run(agent, rows, sampling, n=rollout.n, on_call=on_call)
        raw, seconds = rewarder.score(examples, groups)
        reward_time += seconds
        if own_examples:
            started = raw[len(raw) - len(own_examples):]
        shaped = raw.copy()
        if config.overlong.enabled:
            shaped += overlong_penalties(groups, config.overlong.buffer,
                                         config.overlong.penalty_factor)
        keep = dapo.informative_groups(shaped) if dynamic else np.ones(len(groups), bool)
        for g in np.flatnonzero(keep)[:need]:
            kept_examples.append(examples[g])
            kept_groups.append(groups[g])
            kept_rewards.append(shaped[g])
        all_groups.extend(groups)
        all_raw.append(raw)
        all_shaped.append(shaped)
        tries += 1
    stats = rollout_stats(all_groups, np.concatenate(all_raw), np.concatenate(all_shaped))
    if len(started):
        stats["reward/starts_mean"] = float(started.mean())
        stats["time/starts_s"] = starts_time
    stats.update({"dynamic/kept_fraction": len(kept_groups) / max(len(all_groups), 1),
                  "dynamic/tries": float(tries), "dynamic/kept_groups": float(len(kept_groups)),
                  "time/rollout_s": time.perf_counter() - start - starts_time,
                  "time/reward_s": reward_time})
    stats["rollout/tokens_per_s"] = stats["rollout/generated_tokens"] / stats["time/rollout_s"]
    rewards_array = (np.stack(kept_rewards) if kept_rewards
                     else np.zeros((0, rollout.n), np.float32))
    return RolloutBatch(kept_examples, kept_groups, rewards_array, drawn, tries, stats)


def supervised_batch(iterator, prompts: int, rewarder: Rewarder,
                     target: Callable[[Example], Trajectory]) -> RolloutBatch:
    """`collect_batch`'s result for a supervised step: the next `prompts` examples, one
    `target` trajectory each (groups of 1), and their final replies' rewards
    (`rewarder`): 1 where the target's answer is one the verifier accepts."""
    start = time.perf_counter()
    examples = take(iterator, prompts)
    groups = [[target(e)] for e in examples]
    rewards, seconds = rewarder.score(examples, groups)
    stats = rollout_stats(groups, rewards, rewards)
    stats.update({"time/rollout_s": time.perf_counter() - start, "time/reward_s": seconds})
    return RolloutBatch(examples, groups, rewards, [e.index for e in examples], 1, stats)


def rollout_stats(groups: list[list[Trajectory]], raw: np.ndarray, shaped: np.ndarray
                  ) -> dict[str, float]:
    """Means over every sampled trajectory: rewards (of those scored: not of the ones past
    their deadline, whose count is `rollout/timed_out`), lengths (generated tokens), turns
    (conversations), replies, truncations, and the agent's own metrics (`agent/NAME`);
    `rollout/memory_length`, the mean length of MemAgent's memory updates (turns of kind
    "update"; `memagent-jax curves` draws it), only where there are any."""
    trajectories = [t for group in groups for t in group]
    turns = [turn for t in trajectories for turn in t.turns]
    updates = [c.generated_tokens for c in turns if c.kind == "update"]
    finals = [c.generated_tokens for c in turns if c.kind == "final"]
    responses = [c.generated_tokens or 0 for c in turns]  # None: a server's, uncounted

    def mean(values):
        return float(np.mean(values)) if len(values) else 0.0

    scored = ~np.isnan(raw)
    agent = {f"agent/{name}": mean([t.metrics[name] for t in trajectories if name in t.metrics])
             for name in dict.fromkeys(k for t in trajectories for k in t.metrics)}
    memory = {"rollout/memory_length": mean(updates)} if updates else {}
    return {**agent,
        "reward/mean": mean(raw[scored]),
        "reward/std": float(np.std(raw[scored])) if scored.any() else 0.0,
        "reward/shaped_mean": mean(shaped[scored]),
        "rollout/response_length": mean(responses),
        **memory,
        "rollout/final_length": mean(finals),
        "rollout/prompt_length": mean([len(c.prompt_ids) for c in turns]),
        "rollout/turns": mean([len(t.turns) for t in trajectories]),
        "rollout/replies": mean([sum(len(c.replies()) for c in t.turns) for t in trajectories]),
        "rollout/truncated_fraction": mean([c.finish_reason == "length" for c in turns]),
        "rollout/answered_fraction": mean([t.answer is not None for t in trajectories]),
        "rollout/trajectories": float(len(trajectories)),
        "rollout/timed_out": float(sum(t.timed_out for t in trajectories)),
        "rollout/generated_tokens": float(sum(responses)),
    }
