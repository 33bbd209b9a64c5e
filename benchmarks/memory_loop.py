"""MemAgent memory-loop throughput: document tokens per second against document length and batch.

MemAgent reads a document chunk by chunk with a fixed-size prompt per chunk (template + question
+ memory + chunk), so its cost should be linear in the document length: the time per document
token should not grow from 16K to 1M tokens (goal: long / short <= 1.1). This script measures
that, and the speed against a straightforward `transformers` implementation of the same loop.

- Model: a random-weight Qwen2 (`tests.hf_reference.write_hf_model`, default hidden 128, 2
  layers, float32) and the word-level test tokenizer (`write_tiny_tokenizer`, every word one
  token, a chat template), written to one directory. Documents are random vocabulary words.
  This model does emit EOS in some turns, so by default neither side stops at it: every turn
  generates exactly its cap and the work per chunk is fixed (`--stop-at-eos` stops both at
  EOS). The mean update-reply length of every run is printed to check that.
- Ours: `build_runner(MemAgent(config), model, tokenizer, EngineConfig(slots=batch, ...))`
  (the engine sized as every front end sizes it), all `batch` documents in one
  `runner.run(agent, ..., SamplingParams(temperature=0.0))`; `engine.warm_up(params, ...)`
  (compilation) and one untimed 2-chunk run are excluded. Document tokens/s = batch x
  length / wall time, which includes tokenizing the documents and every turn's chat-template
  prompt.
- Peer: the loop written directly on transformers (`PeerLoop`): per chunk index, every
  document's update prompt (the same `templates` functions, so identical token ids), left-padded
  into one batch, one `model.generate(max_new_tokens=cap, do_sample=False)`, replies decoded as
  the new memories; then the final prompt. Same weights, float32, torch.set_num_threads(cores),
  on the GPU when torch sees one.
  It runs right after ours at the same batch and length, so both see the same machine load.
- `--profile` reruns ours with each engine call timed separately (blocking after each), to
  split the wall time into prefill, insert, decode steps and host work (Python: tokenization,
  templates, scheduling).

    python benchmarks/memory_loop.py [--lengths 16384,32768,65536,262144,1048576]
        [--batch-sizes 1,8,32] [--max-batch-tokens 1048576] [--peer-lengths 16384]
        [--peer-batch-sizes 1,8,32] [--chunk-tokens 1024] [--memory-tokens 48] [--prefill-rows 1]
        [--profile]

The defaults take about 9 minutes on a quiet 2-core CPU: runs of more than --max-batch-tokens
document tokens (batch x length) are skipped, so batch 8 stops at 64K and batch 32 at 32K.
"""

from __future__ import annotations

import argparse
import atexit
import os
import platform
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

import jax
import numpy as np
from machine import cpu_model_name  # beside this script

from memagent_jax.agents.memagent.agent import MemAgent
from memagent_jax.agents.memagent.config import MemAgentConfig
from memagent_jax.agents.memagent.reading import read_sample
from memagent_jax.agents.memagent.templates import TokenPrompts
from memagent_jax.engine.engine import Engine
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.models.loading import load_model
from memagent_jax.models.qwen import split_params
from memagent_jax.rollout.runner import AgentRunner, build_runner
from memagent_jax.tokenizer import load_tokenizer
from tests.hf_reference import write_hf_model, write_tiny_tokenizer

QUESTION = "what is the answer"
EOS, PAD = 2, 0


def documents(words: list[str], batch: int, length: int, seed: int) -> list[tuple[str, str]]:
    rng = np.random.default_rng(seed)
    return [(QUESTION, " ".join(np.asarray(words)[rng.integers(0, len(words), length)]))
            for _ in range(batch)]


class Timed:
    """Wraps an engine's prefill/insert/generate, blocking on each result, and sums seconds."""

    def __init__(self, engine: Engine):
        self.seconds = {"prefill": 0.0, "insert": 0.0, "decode": 0.0}
        self.calls = dict.fromkeys(self.seconds, 0)
        for name, attr in (("prefill", "prefill"), ("insert", "insert"),
                           ("decode", "generate")):
            setattr(engine, attr, self._wrap(name, getattr(engine, attr)))

    def _wrap(self, name, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = jax.block_until_ready(fn(*args, **kwargs))
            self.seconds[name] += time.perf_counter() - start
            self.calls[name] += 1
            return out
        return timed


def run_ours(agent: MemAgent, runner: AgentRunner, samples) -> tuple[float, float, float]:
    """(wall s, process cpu s, mean update-reply tokens) of one runner.run over `samples`
    ((question, document) pairs; reading them into chunks is timed too)."""
    wall, cpu = time.perf_counter(), time.process_time()
    results = runner.run(agent, [agent.read(q, d) for q, d in samples],
                         SamplingParams(temperature=0.0))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    replies = [len(c.response_ids) for (t,) in results for c in t.turns if c.kind == "update"]
    return wall, cpu, float(np.mean(replies))


class PeerLoop:
    """The same loop on transformers: one left-padded `generate` per chunk index."""

    def __init__(self, path: str, tokenizer, config: MemAgentConfig, eos: int | None):
        import torch
        from transformers import AutoModelForCausalLM
        self.torch, self.tokenizer, self.config = torch, tokenizer, config
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(
            self.device).eval()
        self.reply_lengths: list[int] = []
        self.eos = eos

    def generate(self, prompts: list[list[int]], cap: int) -> list[list[int]]:
        """Greedy replies to left-padded prompts: each reply's ids without its stop token."""
        torch, width = self.torch, max(len(p) for p in prompts)
        ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                            device=self.device)
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=cap,
                                      do_sample=False, pad_token_id=PAD,
                                      eos_token_id=self.eos)
        replies = []
        for row in out[:, width:].tolist():
            if self.eos is not None and self.eos in row:  # generate pads after the stop
                row = row[:row.index(self.eos) + 1]
            self.reply_lengths.append(len(row))
            replies.append([t for t in row if t != self.eos])
        return replies

    def timed_run(self, samples) -> tuple[float, float, float]:
        """(wall s, process cpu s, mean update-reply tokens) of one run over `samples`."""
        self.reply_lengths = []
        wall, cpu = time.perf_counter(), time.process_time()
        self.run(samples)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        return wall, cpu, float(np.mean(self.reply_lengths[:self.final_start]))

    def run(self, samples) -> list[list[int]]:
        """The workflow's prompts, built as ours (templates.TokenPrompts); the final replies."""
        prompts = TokenPrompts(self.tokenizer)
        read = [read_sample(self.tokenizer, p, d, self.config) for p, d in samples]
        memories = [prompts.initial_memory] * len(samples)
        for k in range(max(len(r.chunks) for r in read)):
            live = [i for i, r in enumerate(read) if k < len(r.chunks)]
            batch = [prompts.update(read[i].problem_ids, memories[i], read[i].chunks[k])
                     for i in live]
            for i, memory in zip(live, self.generate(batch, self.config.max_memory_tokens)):
                memories[i] = memory
        self.final_start = len(self.reply_lengths)
        return self.generate([prompts.final(r.problem_ids, m) for r, m in zip(read, memories)],
                             self.config.max_final_tokens)


def machine() -> str:
    name = cpu_model_name()
    import torch
    import transformers
    return (f"{os.cpu_count()}-core {platform.machine()} ({name}), jax {jax.__version__} "
            f"[{jax.devices()[0].platform}], torch {torch.__version__}, "
            f"transformers {transformers.__version__}")


def main() -> None:
    ints = lambda s: [int(x) for x in s.split(",") if x]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=ints, default=[16384, 32768, 65536, 262144, 1048576])
    parser.add_argument("--batch-sizes", type=ints, default=[1, 8, 32])
    parser.add_argument("--max-batch-tokens", type=int, default=1048576,
                        help="skip runs of more document tokens than this (batch x length)")
    parser.add_argument("--peer-lengths", type=ints, default=[16384])
    parser.add_argument("--peer-batch-sizes", type=ints, default=[1, 8, 32])
    parser.add_argument("--chunk-tokens", type=int, default=1024)
    parser.add_argument("--memory-tokens", type=int, default=48)
    parser.add_argument("--final-tokens", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--attention", default="xla", help="load_model's attention option")
    parser.add_argument("--stop-at-eos", action="store_true",
                        help="stop replies at EOS (default: every reply runs to its cap)")
    parser.add_argument("--prefill-rows", type=int, default=1,
                        help="engine prefill_rows: prompts prefilled per call (at most batch)")
    parser.add_argument("--profile", action="store_true",
                        help="rerun the shortest length per batch with each engine call timed")
    args = parser.parse_args()

    config = MemAgentConfig(chunk_tokens=args.chunk_tokens, max_memory_tokens=args.memory_tokens,
                            max_final_tokens=args.final_tokens, max_problem_tokens=16)
    path = tempfile.mkdtemp(prefix="memory_loop_")
    atexit.register(shutil.rmtree, path, True)
    words = [w for w in write_tiny_tokenizer(path) if w.isalpha()]
    write_hf_model(path, seed=0, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                   num_hidden_layers=args.layers, num_attention_heads=args.heads,
                   num_key_value_heads=args.kv_heads,
                   max_position_embeddings=4 * args.chunk_tokens)
    tokenizer = load_tokenizer(path)
    model, _ = load_model(path, dtype="float32", attention=args.attention)
    params = split_params(model)[1]
    stop_ids = (EOS,) if args.stop_at_eos else ()
    # Warm-up compiles only the buckets the loop's prompts use (all of them, unrolled over the
    # layers, take minutes on a GPU at 0.5B widths): the shortest and longest update prompt and
    # the longest final prompt.
    sizer = MemAgent(config, tokenizer)
    prompts = sizer.prompts
    question = read_sample(tokenizer, QUESTION, "hello", config).problem_ids
    longest_memory, chunk = [EOS + 1] * args.memory_tokens, [EOS + 1] * args.chunk_tokens
    prompt_lengths = [len(prompts.update(question, memory, chunk))
                      for memory in (prompts.initial_memory, longest_memory)]
    prompt_lengths.append(len(prompts.final(question, longest_memory)))
    print(machine())
    sized = EngineConfig().sized_for(sizer.engine_need(tokenizer)[0])
    max_len, buckets = sized.max_len, sized.buckets()
    print(f"model: Qwen2 hidden {args.hidden}, {args.layers} layers, {args.heads}/"
          f"{args.kv_heads} heads, vocab "
          f"{model.config.vocab_size}, float32, random weights, {args.attention} attention; "
          f"chunk {args.chunk_tokens} tokens, memory cap {args.memory_tokens}, final cap "
          f"{args.final_tokens}; engine "
          f"max_len {max_len}, prefill buckets {buckets}, prefill rows up to "
          f"{args.prefill_rows}; replies stop at EOS: "
          f"{args.stop_at_eos}")

    peer = None
    if args.peer_batch_sizes and args.peer_lengths:
        import torch
        torch.set_num_threads(os.cpu_count() or 1)
        peer = PeerLoop(path, tokenizer, config, EOS if args.stop_at_eos else None)
        peer.generate([[3, 4, 5]] * 2, 2)  # warm-up

    # per (impl, batch, length): (wall, cpu) seconds per document token
    per_token: dict[tuple[str, int, int], tuple[float, float]] = {}

    def report(impl, batch, length, wall, cpu, reply):
        per_token[impl, batch, length] = (wall / (batch * length), cpu / (batch * length))
        turns = batch * (-(-length // args.chunk_tokens) + 1)
        print(f"{impl:13} {batch:5d} {length:10d} {turns:6d} {wall:8.2f} {cpu:8.2f} "
              f"{batch * length / wall:10.0f} {1e6 * wall / (batch * length):10.2f} "
              f"{reply:6.1f}", flush=True)

    print(f"{'impl':13} {'batch':>5} {'doc tokens':>10} {'turns':>6} {'wall s':>8} {'cpu s':>8} "
          f"{'doc tok/s':>10} {'us/doc tok':>10} {'reply':>6}")
    for batch in args.batch_sizes:
        agent = MemAgent(config)
        runner = build_runner(agent, model, tokenizer,
                              EngineConfig(slots=batch, prefill_rows=min(args.prefill_rows, batch)),
                              None, stop_ids).with_params(params)
        engine = runner.scheduler.engine
        start = time.perf_counter()
        engine.warm_up(params, prompt_lengths)
        # And one short untimed run, as the peer's warm-up call: first-use host costs
        # (tokenizer, chat template) stay out of the first timed length.
        run_ours(agent, runner, documents(words, batch, 2 * args.chunk_tokens, 0))
        print(f"# batch {batch}: warm-up (compile, one 2-chunk run) "
              f"{time.perf_counter() - start:.1f} s, excluded")
        for length in args.lengths:
            if batch * length > args.max_batch_tokens:
                print(f"# skipped batch {batch} x {length} tokens (> --max-batch-tokens)")
                continue
            samples = documents(words, batch, length, seed=length)
            report("memagent_jax", batch, length, *run_ours(agent, runner, samples))
            if args.profile and length == min(args.lengths):
                timed = Timed(engine)
                wall, _, _ = run_ours(agent, runner, samples)
                del engine.prefill, engine.insert, engine.generate  # the class methods
                parts = dict(timed.seconds, host=wall - sum(timed.seconds.values()))
                print("#   profile (blocking): " + ", ".join(
                    f"{k} {v:.2f} s ({100 * v / wall:.0f}%)" for k, v in parts.items())
                    + f"; per call: prefill {1e3 * parts['prefill'] / timed.calls['prefill']:.1f}"
                    f" ms ({timed.calls['insert'] / timed.calls['prefill']:.1f} prompts), "
                    f"decode step {1e3 * parts['decode'] / timed.calls['decode']:.2f} ms, "
                    f"host per turn {1e3 * parts['host'] / timed.calls['insert']:.2f} ms")
            if peer is not None and batch in args.peer_batch_sizes and length in args.peer_lengths:
                report("transformers", batch, length, *peer.timed_run(samples))
        del agent, runner, engine

    print("\ntime per document token, longest / shortest length (goal <= 1.1), wall and cpu:")
    for batch in args.batch_sizes:
        measured = sorted(n for impl, b, n in per_token if impl == "memagent_jax" and b == batch)
        if len(measured) > 1:
            lo, hi = (per_token["memagent_jax", batch, n] for n in (measured[0], measured[-1]))
            print(f"  batch {batch:2d}: {measured[-1]} / {measured[0]} tokens: "
                  f"{hi[0] / lo[0]:.3f} wall, {hi[1] / lo[1]:.3f} cpu")
    print("speed, memagent_jax / transformers (goal >= 5x at batch 8), wall and cpu:")
    for impl, batch, length in per_token:
        if impl == "transformers":
            ours, theirs = per_token["memagent_jax", batch, length], per_token[impl, batch, length]
            print(f"  batch {batch:2d}, {length} tokens: {theirs[0] / ours[0]:.2f}x wall, "
                  f"{theirs[1] / ours[1]:.2f}x cpu")

if __name__ == "__main__":
    main()
