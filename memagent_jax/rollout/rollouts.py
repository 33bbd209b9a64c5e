"""The rollout contract: running an agent over rows, the one road every command takes (`train`,
`eval`, `run`, `demo`, `trace`, a plugin's reads, the benchmarks).

    rollouts.run(agent, rows, sampling, n=1, on_call=None, on_done=None)
        -> [len(rows)][n] Trajectory

n rollouts of every row (`agent.rollout(row, policy)`, rollout/agent_api.py), each call sampled
as `sampling` says (temperature, top-p, top-k) with a seed of its own derived from
`sampling.seed` (None: a fresh one), the row's place, the rollout's index and the call's
(`runner.call_seed`). Two implementations: on the engine, `runner.AgentRunner` (sampling with
the parameters it holds, `with_params`), and against an OpenAI-compatible server,
`client.ServerRollouts`. A rollout that raises stops the run with its exception.

Limits (`Limits`, `rollouts.with_limits(limits)`: a copy running under them; training's are
`rollout.timeout_s` and `rollout.max_concurrent`): at most `max_concurrent` rollouts are in
flight at once (the others wait their turn, in order), and a rollout still running
`timeout_s` seconds after it started is cancelled (its engine requests dropped, its slots
freed) and returned as a trajectory with `timed_out` set and no conversations: nothing of it is
trained, it has no reward (`scoring.Rewarder`: NaN) and no place in its group's baseline
(`rl/advantages.py`). Deadlines read each process's own clock, so a run on many processes
refuses `timeout_s` (the processes would cancel different rollouts).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from memagent_jax.rollout.agent_api import Trajectory

if TYPE_CHECKING:
    from memagent_jax.engine.sampling import SamplingParams

# on_call(row index): after every reply, before its rollout sees it (progress; a stop may raise
# from it).
OnCall = Callable[[int], None]
# on_done(row index, its n trajectories): once all of a row's rollouts have finished.
OnDone = Callable[[int, list[Trajectory]], None]


T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Limits:
    """A run's limits on its rollouts (module docstring). timeout_s: seconds a rollout may run
    (None: no deadline); max_concurrent: rollouts in flight at once (None: every one)."""
    timeout_s: float | None = None
    max_concurrent: int | None = None

    def gate(self) -> asyncio.Semaphore | None:
        """The semaphore a run's rollouts pass to start (None: no bound); make it inside the
        run's event loop."""
        return None if self.max_concurrent is None else asyncio.Semaphore(self.max_concurrent)


async def within(limits: Limits, gate: asyncio.Semaphore | None,
                 rollout: Callable[[], Awaitable[T]]) -> tuple[T | None, bool]:
    """(rollout()'s result, False) once `gate` lets it start, or (None, True) where it was
    still running `limits.timeout_s` seconds after it started (it is cancelled). A
    TimeoutError of the rollout's own (a tool's) is raised as any error is."""
    async with gate or contextlib.nullcontext():
        deadline = asyncio.timeout(limits.timeout_s)
        try:
            async with deadline:
                return await rollout(), False
        except TimeoutError:
            if not deadline.expired():
                raise
            return None, True


class Rollouts(Protocol):
    """Runs an agent over rows (module docstring)."""

    def with_limits(self, limits: Limits) -> Rollouts:
        """These rollouts, run under `limits`."""
        ...

    def run(self, agent: Any, rows: list, sampling: SamplingParams, n: int = 1,
            on_call: OnCall | None = None, on_done: OnDone | None = None
            ) -> list[list[Trajectory]]:
        """n trajectories of every row, in order."""
        ...
