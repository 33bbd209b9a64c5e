"""Scoring rollouts: the `reward` section's function over each trajectory's final reply.

`reward.function` is a verifier's name (rl/rewards.py: `strict`, `lenient_boxed`,
`exact_match`, `f1`; `by_source` picks one by each row's `data_source`; `contains`), run in the
trainer's process, or a function by module path (`my_package.my_reward`, its `compute_score`;
`my_package.my_reward:my_score` names another), with verl's signature:

    compute_score(data_source, solution_str, ground_truth, extra_info) -> float

(or a dict with a "score"). solution_str is the text of the final conversation's last reply;
ground_truth the row's `reward_model.ground_truth` as stored; extra_info its `extra_info`.
Such a function runs in a pool of `reward.workers` processes (spawned: they share nothing with
the trainer's JAX runtime), so a slow reward never holds the trainer's process, with
`reward.timeout_s` seconds for each call. One that raises, hangs or returns something other
than a finite number stops the step before anything of it is applied: one line naming the
function, the row and what went wrong. On many processes, process 0 scores and shares the
scores, so a reward that reads time, randomness or I/O is computed once.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import multiprocessing
import multiprocessing.pool
import time
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from memagent_jax.distributed import collectives
from memagent_jax.errors import ConfigError, UserError
from memagent_jax.rl import rewards
from memagent_jax.runconfig import at_least

BUILT_IN = ("by_source", "strict", "lenient_boxed", "exact_match", "f1", "contains")


@dataclasses.dataclass(frozen=True)
class RewardSection:
    """The `reward` section of the train config (module docstring)."""
    SECTION: ClassVar[str] = "reward"
    function: str = "by_source"   # a verifier's name, or module[:function] (verl's signature)
    workers: int = 2              # processes a module's function runs in
    timeout_s: float = 60.0       # seconds a call may take

    def __post_init__(self):
        at_least(self, 1, "workers")
        if not self.timeout_s > 0:
            raise ConfigError("reward.timeout_s", f"must be a positive number of seconds, got "
                                                  f"{self.timeout_s!r}")
        if self.function not in BUILT_IN:
            _import(self.function)  # fails here, as the config is read

    @property
    def label(self) -> str:
        return self.function if self.function in BUILT_IN else _target(self.function)[2]


def contains_reward(response: str, ground_truths) -> float:
    """1.0 when a normalised gold answer appears as a whole phrase in the normalised reply."""
    from memagent_jax.eval.metrics import normalize_answer

    truths = [ground_truths] if isinstance(ground_truths, str) else ground_truths
    text = f" {normalize_answer(response)} "
    return float(any(f" {g} " in text for g in map(normalize_answer, truths) if g))


def verifier(name: str, data_source: str) -> rewards.RewardFn:
    """A built-in reward (module docstring) for a row of `data_source`."""
    if name == "by_source":
        return rewards.reward_function(data_source)
    if name == "contains":
        return contains_reward
    return rewards.reward_function(name)


class Rewarder:
    """Scores trajectories as the `reward` section says (module docstring); `close()` ends
    its pool."""

    def __init__(self, section: RewardSection):
        self.section = section
        self._pool: multiprocessing.pool.Pool | None = None

    def score(self, examples: list, groups: list[list]) -> tuple[np.ndarray, float]:
        """([G, n] float32 rewards of each trajectory's final reply, seconds taken); a
        trajectory that passed its deadline (`Trajectory.timed_out`) is not scored: NaN."""
        start = time.perf_counter()
        flat = [t for group in groups for t in group]
        jobs = [(e, t.final_reply) for e, group in zip(examples, groups) for t in group
                if not t.timed_out]
        scores = iter(collectives.on_main(self._score_all, jobs))
        shape = (len(groups), len(groups[0]) if groups else 0)
        rewards = [math.nan if t.timed_out else next(scores) for t in flat]
        return np.asarray(rewards, np.float32).reshape(shape), time.perf_counter() - start

    def _score_all(self, jobs) -> list[float]:
        name = self.section.function
        if name in BUILT_IN:
            return [float(verifier(name, e.data_source)(reply, list(e.ground_truths)))
                    for e, reply in jobs]
        if self._pool is None:
            self._pool = multiprocessing.get_context("spawn").Pool(self.section.workers)
        pending = [self._pool.apply_async(_call, (name, e.data_source, reply,
                                                  _ground_truth(e), dict(e.extra_info)))
                   for e, reply in jobs]
        scores = []
        for (example, _), result in zip(jobs, pending):
            where = f"reward {self.section.label}: row {example.index} ({example.data_source})"
            try:
                ok, value = result.get(self.section.timeout_s)
            except multiprocessing.TimeoutError:
                self.close()
                raise UserError(f"{where}: no score within reward.timeout_s = "
                                f"{self.section.timeout_s:g} s") from None
            if not ok:
                raise UserError(f"{where}: raised {value}")
            scores.append(_number(value, where))
        return scores

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None


def _ground_truth(example):
    """The row's `reward_model.ground_truth` as stored (the parsed ones where the row has
    none)."""
    reward_model = example.fields.get("reward_model") if example.fields else None
    if isinstance(reward_model, dict) and "ground_truth" in reward_model:
        return reward_model["ground_truth"]
    return list(example.ground_truths)


def _number(value, where: str) -> float:
    if isinstance(value, dict) and "score" in value:
        value = value["score"]
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or \
            not math.isfinite(float(value)):
        raise UserError(f"{where}: returned {value!r:.80} ({type(value).__name__}), not a "
                        "finite number")
    return float(value)


def _target(spec: str) -> tuple[str, str, str]:
    module, _, function = spec.partition(":")
    function = function or "compute_score"
    return module, function, f"{module}.{function}"


def _import(spec: str) -> Callable:
    module_name, function, label = _target(spec)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError("reward.function", f"{spec!r} is neither a built-in reward "
                                             f"({', '.join(BUILT_IN)}) nor an importable "
                                             f"module ({e})") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ConfigError("reward.function", f"module {module_name!r} has no function "
                                             f"{function}(data_source, solution_str, "
                                             "ground_truth, extra_info)")
    return fn


def _call(spec, data_source, solution_str, ground_truth, extra_info):
    """In a pool process: (True, the function's value) or (False, what it raised)."""
    try:
        return True, _import(spec)(data_source, solution_str, ground_truth, extra_info)
    except BaseException as e:  # reported to the trainer as one line
        return False, f"{type(e).__name__}: {e}"
