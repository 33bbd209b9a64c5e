"""What the agent interface costs MemAgent: the memory loop through it against the loop it
replaced, and both against the engine's own time.

- Ours: `AgentRunner.run` (MemAgent's rollout on the rollout contract's engine
  implementation: an asyncio task per trajectory, every call queued and submitted between
  engine steps).
- Peer: the loop as a43aa52 ran it (tests/reference_memory_loop.py: each next turn submitted
  from the last one's completion callback), on a scheduler of the same engine.
- Limit: the engine's own time in the same run (every prefill, insert and decode step timed,
  blocking), the rest being host work; "ours / peer" is what the interface adds.

Both produce the same tokens (checked each repeat). A DAPO step is this rollout plus the
learner's update, which the interface does not touch; the step's share is printed beside.

- Model: a random-weight Qwen2 (`tests.hf_reference.write_hf_model`, hidden 128, 2 layers,
  float32), the word-level test tokenizer; documents of random words; n trajectories per
  document at temperature 1 (a group, its first turn one request), replies to their caps.

    python benchmarks/agent_overhead.py [--length 8192] [--batch 8] [--n 4] [--repeats 5]
"""

from __future__ import annotations

import argparse
import atexit
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

import jax
import numpy as np
from machine import cpu_model_name  # beside this script
from memory_loop import Timed, documents

from memagent_jax.agents.memagent.agent import MemAgent
from memagent_jax.agents.memagent.config import MemAgentConfig
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Scheduler
from memagent_jax.models.loading import load_model
from memagent_jax.models.qwen import split_params
from memagent_jax.rollout.runner import build_runner
from memagent_jax.tokenizer import load_tokenizer
from tests.hf_reference import write_hf_model, write_tiny_tokenizer
from tests.reference_memory_loop import reference_run


def tokens_of(groups) -> list:
    return [[t.response_ids for t in trajectory.turns] for group in groups
            for trajectory in group]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=8192, help="document tokens")
    parser.add_argument("--batch", type=int, default=8, help="documents read together")
    parser.add_argument("--n", type=int, default=4, help="trajectories per document")
    parser.add_argument("--chunk-tokens", type=int, default=1024)
    parser.add_argument("--memory-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    path = tempfile.mkdtemp(prefix="agent_overhead_")
    atexit.register(shutil.rmtree, path, True)
    words = [w for w in write_tiny_tokenizer(path) if w.isalpha()]
    write_hf_model(path, seed=0, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2,
                   max_position_embeddings=4 * args.chunk_tokens)
    tokenizer = load_tokenizer(path)
    model, _ = load_model(path, dtype="float32")
    params = split_params(model)[1]
    config = MemAgentConfig(chunk_tokens=args.chunk_tokens, max_memory_tokens=args.memory_tokens,
                            max_final_tokens=16, max_problem_tokens=16)
    # No stop id: every reply runs to its cap, so both loops do the same work.
    agent = MemAgent(config)
    runner = build_runner(agent, model, tokenizer, EngineConfig(slots=args.batch * args.n),
                          None, ()).with_params(params)
    samples = [agent.read(q, d) for q, d in documents(words, args.batch, args.length, 0)]
    sampling = SamplingParams(1.0, seed=0)
    engine = runner.scheduler.engine

    def ours():
        return runner.run(agent, samples, sampling, n=args.n)

    def peer():
        return reference_run(agent, Scheduler(engine), params, samples, sampling, n=args.n)

    expected = tokens_of(ours())  # warm-up: every program compiled
    assert tokens_of(peer()) == expected
    times = {"ours": [], "peer": []}
    for _ in range(args.repeats):
        for name, fn in (("ours", ours), ("peer", peer)):
            start = time.perf_counter()
            result = fn()
            times[name].append(time.perf_counter() - start)
            assert tokens_of(result) == expected
    timed = Timed(engine)
    start = time.perf_counter()
    ours()
    profiled = time.perf_counter() - start
    engine_s = sum(timed.seconds.values())
    ours_s, peer_s = statistics.median(times["ours"]), statistics.median(times["peer"])
    turns = sum(len(t) for t in expected)
    print(f"machine: {os.cpu_count()}-core {platform.machine()} ({cpu_model_name()}), jax "
          f"{jax.__version__} [{jax.devices()[0].platform}]")
    print(f"{args.batch} documents of {args.length} tokens x n {args.n}: {turns} turns, "
          f"median of {args.repeats}")
    print(f"ours (agent interface) {ours_s:.3f} s | peer (callback loop) {peer_s:.3f} s | "
          f"ours / peer (speed) {peer_s / ours_s:.3f}")
    print(f"engine alone {engine_s:.3f} s of a {profiled:.3f} s run with each call blocking "
          f"(host work {(profiled - engine_s) / profiled:.1%} of it): ours / engine "
          f"(speed) {engine_s / ours_s:.3f} (above 1: host work hidden under the device's)")
    print(f"spread: ours {min(times['ours']):.3f}-{max(times['ours']):.3f} s, peer "
          f"{min(times['peer']):.3f}-{max(times['peer']):.3f} s")
    np.testing.assert_equal(len(expected), args.batch * args.n)


if __name__ == "__main__":
    main()
