"""One step's rollout batch: memory-loop rollouts, rewards, overlong shaping, dynamic sampling.

`collect_batch` draws prompts from the data iterator, runs n MemoryAgent trajectories per prompt
(every chunk's memory update and the final answer), scores each trajectory's final reply with
its verifier, adds DAPO's overlong penalty, and, with dynamic sampling on, keeps only groups
whose rewards are not all equal, drawing more prompts until `prompts` groups are kept or the
tries run out (docs/algorithm.md section 3); prompts the caller makes itself (a
plugin's starts, rl/plugin.py) take the place of drawn ones in the first round. It returns the
kept groups, their shaped rewards [G, n], the indices of every example drawn (the data order,
logged per step), and rollout statistics over every trajectory sampled. `supervised_batch` is
its counterpart for a supervised step: one given target trajectory per drawn example.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np

from memagent_jax.data.pipeline import Example, take
from memagent_jax.rl import dapo, rewards
from memagent_jax.rollout.memagent import MemoryAgent, Sample, Trajectory
from memagent_jax.rollout.sampling import SamplingParams


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


def reward_fn(kind: str, data_source: str) -> rewards.RewardFn:
    """The verifier of data.reward: 'by_source' looks up the row's data_source in rl.rewards'
    registry; 'contains' is contains_reward; any other value names a registered reward
    ('strict', 'lenient_boxed', 'exact_match', 'f1')."""
    if kind == "by_source":
        return rewards.reward_function(data_source)
    if kind == "contains":
        return contains_reward
    return rewards.reward_function(kind)


def contains_reward(response: str, ground_truths) -> float:
    """1.0 when a normalised gold answer appears as a whole phrase in the normalised reply."""
    from memagent_jax.eval.metrics import normalize_answer

    truths = [ground_truths] if isinstance(ground_truths, str) else ground_truths
    text = f" {normalize_answer(response)} "
    return float(any(f" {g} " in text for g in map(normalize_answer, truths) if g))


def score(examples: list[Example], groups: list[list[Trajectory]], reward_kind: str
          ) -> np.ndarray:
    """[G, n] verifier rewards of each trajectory's final reply."""
    return np.array([[reward_fn(reward_kind, e.data_source)(t.final_reply, list(e.ground_truths))
                      for t in group] for e, group in zip(examples, groups)], np.float32)


def overlong_penalties(groups: list[list[Trajectory]], memory_cap: int, final_cap: int,
                       buffer: int, factor: float) -> np.ndarray:
    """[G, n] DAPO soft overlong penalties: each turn against its own cap (memory updates:
    memory_cap; the final answer: final_cap), the trajectory taking its worst."""
    out = np.zeros((len(groups), len(groups[0]) if groups else 0), np.float32)
    for g, group in enumerate(groups):
        for j, trajectory in enumerate(group):
            worst = 0.0
            for c in trajectory.turns:
                cap = memory_cap if c.kind == "update" else final_cap
                worst = min(worst, float(dapo.overlong_penalty([len(c.response_ids)], cap,
                                                               buffer, factor)[0]))
            out[g, j] = worst
    return out


def collect_batch(agent: MemoryAgent, params, iterator, config,
                  seed_for_try: Callable[[int], int], on_turn: Callable | None = None,
                  starts: Callable[[], tuple[list[Example], list[Sample]]] | None = None
                  ) -> RolloutBatch:
    """One step's batch (module docstring), sampled with `params`. config: the TrainConfig;
    seed_for_try(k): the sampling seed of rollout round k; on_turn(sample, turn): called as
    each turn finishes. starts(): prompts that come with their own samples (`Plugin.starts`),
    run in the first round in place of as many drawn from `iterator`; later rounds draw from
    `iterator` only."""
    rollout, budgets, wanted = config.rollout, config.memagent, config.prompts_per_step
    dynamic = config.dynamic_sampling.enabled
    kept_examples, kept_groups, kept_rewards, drawn = [], [], [], []
    all_groups, all_raw, all_shaped, started = [], [], [], []
    tries, start = 0, time.perf_counter()
    while len(kept_groups) < wanted and tries < (config.dynamic_sampling.max_tries
                                                 if dynamic else 1):
        need = wanted - len(kept_groups)
        own_examples, own_samples = starts() if starts and not tries else ([], [])
        examples = take(iterator, need - len(own_examples))
        drawn.extend(e.index for e in examples)
        samples = [agent.read(e.question, e.context, strict=False) for e in examples]
        examples, samples = examples + own_examples, samples + own_samples
        sampling = SamplingParams(rollout.temperature, rollout.top_p, rollout.top_k,
                                  seed=seed_for_try(tries))
        groups = agent.run(params, samples, sampling, n=rollout.n, on_turn=on_turn)
        raw = score(examples, groups, config.data.reward)
        if own_examples:
            started = raw[len(raw) - len(own_examples):]
        shaped = raw.copy()
        if config.overlong.enabled:
            shaped += overlong_penalties(groups, budgets.max_memory_tokens,
                                         budgets.max_final_tokens, config.overlong.buffer,
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
    stats.update({"dynamic/kept_fraction": len(kept_groups) / max(len(all_groups), 1),
                  "dynamic/tries": float(tries), "dynamic/kept_groups": float(len(kept_groups)),
                  "time/rollout_s": time.perf_counter() - start})
    stats["rollout/tokens_per_s"] = stats["rollout/generated_tokens"] / stats["time/rollout_s"]
    rewards_array = (np.stack(kept_rewards) if kept_rewards
                     else np.zeros((0, rollout.n), np.float32))
    return RolloutBatch(kept_examples, kept_groups, rewards_array, drawn, tries, stats)


def supervised_batch(iterator, prompts: int, reward: str,
                     target: Callable[[Example], Trajectory]) -> RolloutBatch:
    """`collect_batch`'s result for a supervised step: the next `prompts` examples, one
    `target` trajectory each (groups of 1), and their final replies' rewards by the verifier
    `reward` names (data.reward): 1 where the target's answer is one the verifier accepts."""
    start = time.perf_counter()
    examples = take(iterator, prompts)
    groups = [[target(e)] for e in examples]
    rewards = score(examples, groups, reward)
    stats = rollout_stats(groups, rewards, rewards)
    stats["time/rollout_s"] = time.perf_counter() - start
    return RolloutBatch(examples, groups, rewards, [e.index for e in examples], 1, stats)


def rollout_stats(groups: list[list[Trajectory]], raw: np.ndarray, shaped: np.ndarray
                  ) -> dict[str, float]:
    """Means over every sampled trajectory: rewards, lengths (tokens), turns, truncations."""
    trajectories = [t for group in groups for t in group]
    turns = [turn for t in trajectories for turn in t.turns]
    updates = [len(c.response_ids) for c in turns if c.kind == "update"]
    finals = [len(c.response_ids) for c in turns if c.kind == "final"]
    responses = [len(c.response_ids) for c in turns]

    def mean(values):
        return float(np.mean(values)) if len(values) else 0.0

    return {
        "reward/mean": mean(raw), "reward/std": float(np.std(raw)) if raw.size else 0.0,
        "reward/shaped_mean": mean(shaped),
        "rollout/response_length": mean(responses),
        "rollout/memory_length": mean(updates),
        "rollout/final_length": mean(finals),
        "rollout/prompt_length": mean([len(c.prompt_ids) for c in turns]),
        "rollout/turns": mean([len(t.turns) for t in trajectories]),
        "rollout/truncated_fraction": mean([c.finish_reason == "length" for c in turns]),
        "rollout/answered_fraction": mean([t.answer is not None for t in trajectories]),
        "rollout/trajectories": float(len(trajectories)),
        "rollout/generated_tokens": float(sum(responses)),
    }
