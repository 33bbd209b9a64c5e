"""What running an agent as an unmodified program costs: the lookup tool agent written as an
`openai`-client program (examples/lookup_openai.py, run by `memagent_jax.agents.program`: a
process per rollout, an HTTP endpoint on loopback) against the shipped tool agent written as a
function (`memagent_jax.agents.tool_calling`), on one engine, the same rows and sampling.

- Ours: the program agent's rollouts (`AgentRunner.run`), what a training step's rollout
  phase runs with `configs/lookup/program_openai.yaml`: each rollout forked from a server
  that imported `openai` once (`agent.preload`, the config's), and as a process of its own
  (no preload).
- Peer: the function agent's rollouts (`configs/lookup/01_dapo.yaml`'s agent).
- Limit: the engine's own time in a run of the function agent with every prefill, insert and
  decode timed, blocking; the rest of a rollout phase is host work.

Both record the same conversations (ids and masks exactly, log-probs within 1e-4: checked
each repeat), but where a reply's call does not parse: the function agent sends the error back
and reads another reply, the program (given no `tool_calls`) ends there; they are counted.
Model: `checkpoints/lookup/start` (shipped), float32; rows from the lookup task's seed 7201
(its development seed), n rollouts a row at temperature 1.

    python benchmarks/program_agent.py [--rows 8] [--n 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import jax
import numpy as np
from machine import cpu_model_name  # beside this script
from memory_loop import Timed

from memagent_jax.data.pipeline import example_from_row
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.factory import load_model_section
from memagent_jax.engine.model_section import ModelSection
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.lookup import task
from memagent_jax.rollout.agent_api import load_agent
from memagent_jax.rollout.runner import build_runner


def recorded(groups) -> list:
    """Every conversation's prompt ids, response ids, loss mask and behaviour log-probs (0
    where a token was not sampled)."""
    return [(c.prompt_ids, c.response_ids, c.response_mask,
             np.array([lp or 0.0 for lp in c.response_logprobs]))
            for group in groups for trajectory in group for c in trajectory.turns]


def differing(function: list, program: list) -> int:
    """How many of the program's conversations are not the function agent's. Equal ones have
    the same ids and mask and log-probs within 1e-4 (requests batched otherwise sum in
    another order); the others must be the function agent's cut after a reply: a call that did
    not parse, whose error the function agent sends back as the tool message while the
    program, given no `tool_calls`, answers with that reply."""
    assert len(function) == len(program)
    count = 0
    for (prompt, ids, mask, logprobs), (prompt_p, ids_p, mask_p, logprobs_p) in zip(
            function, program):
        assert prompt == prompt_p
        if ids == ids_p:
            assert mask == mask_p and np.abs(logprobs - logprobs_p).max() <= 1e-4
        else:
            assert ids[:len(ids_p)] == ids_p, "the program's conversation is not the agent's"
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=8, help="rows (questions) a run")
    parser.add_argument("--n", type=int, default=8, help="rollouts a row")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    section = ModelSection(path=os.path.join(ROOT, "checkpoints", "lookup", "start"),
                           compute_dtype="float32")
    loaded = load_model_section(section, section.load_tokenizer(required=True))
    common = {"max_tokens": 32}
    function = load_agent({"module": "memagent_jax.agents.tool_calling", **common,
                           "tools": ["memagent_jax.lookup.tools:lookup"], "max_turns": 2,
                           "max_length": 320}, None)
    agents = {"function": function}
    for name, preload in (("forked", ["openai"]), ("spawned", [])):
        agents[name] = load_agent({
            "module": "memagent_jax.agents.program", **common, "max_length": 320,
            "preload": preload,
            "command": [sys.executable, os.path.join(ROOT, "examples", "lookup_openai.py")]},
                                  None)
    engine = EngineConfig(slots=args.rows * args.n, prefill_buckets=(256, 320))
    runners = {name: build_runner(agent, loaded.model, loaded.tokenizer, engine, None,
                                  loaded.stop_ids).with_params(loaded.params)
               for name, agent in agents.items()}
    rows = [example_from_row(task.make_row(7201, i), i) for i in range(args.rows)]
    sampling = SamplingParams(1.0, seed=0)

    def run(name):
        return runners[name].run(agents[name], rows, sampling, n=args.n)

    expected = recorded(run("function"))  # warm-up: every program compiled
    cut = differing(expected, recorded(run("spawned")))
    assert differing(expected, recorded(run("forked"))) == cut
    times: dict[str, list[float]] = {name: [] for name in agents}
    for _ in range(args.repeats):
        for name in times:
            start = time.perf_counter()
            groups = run(name)
            times[name].append(time.perf_counter() - start)
            assert differing(expected, recorded(groups)) == (0 if name == "function" else cut)
    timed = Timed(runners["function"].scheduler.engine)
    start = time.perf_counter()
    run("function")
    blocking = time.perf_counter() - start
    engine_s = sum(timed.seconds.values())
    median = {name: statistics.median(t) for name, t in times.items()}
    peer = median["function"]
    rollouts = args.rows * args.n
    print(f"machine: {os.cpu_count()}-core {platform.machine()} ({cpu_model_name()}), jax "
          f"{jax.__version__} [{jax.devices()[0].platform}]")
    print(f"{args.rows} rows x n {args.n}: {rollouts} rollouts, {len(expected)} conversations "
          f"({cut} ended by the program at a call that did not parse), median of "
          f"{args.repeats}")
    for name in ("forked", "spawned"):
        ours = median[name]
        print(f"ours (program, {name}) {ours:.3f} s ({ours / rollouts * 1e3:.1f} ms a rollout) "
              f"| peer (function) {peer:.3f} s | ours / peer (speed) {peer / ours:.3f} | ours / "
              f"engine (speed) {engine_s / ours:.3f}")
    print(f"engine alone {engine_s:.3f} s of a {blocking:.3f} s blocking run of the function "
          f"agent: peer / engine {engine_s / peer:.3f}")
    print("spread: " + ", ".join(f"{name} {min(t):.3f}-{max(t):.3f} s"
                                 for name, t in times.items()))


if __name__ == "__main__":
    main()
