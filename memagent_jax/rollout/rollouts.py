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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

from memagent_jax.rollout.agent_api import Trajectory

if TYPE_CHECKING:
    from memagent_jax.engine.sampling import SamplingParams

# on_call(row index): after every reply, before its rollout sees it (progress; a stop may raise
# from it).
OnCall = Callable[[int], None]
# on_done(row index, its n trajectories): once all of a row's rollouts have finished.
OnDone = Callable[[int, list[Trajectory]], None]


class Rollouts(Protocol):
    """Runs an agent over rows (module docstring)."""

    def run(self, agent: Any, rows: list, sampling: SamplingParams, n: int = 1,
            on_call: OnCall | None = None, on_done: OnDone | None = None
            ) -> list[list[Trajectory]]:
        """n trajectories of every row, in order."""
        ...
