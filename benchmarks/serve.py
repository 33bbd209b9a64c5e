"""`memagent-jax serve` throughput: 64 concurrent clients against one client at a time, beside
the same comparison for `transformers` served naively.

- Model: a random-weight Qwen2 (`tests.hf_reference.write_hf_model`, default hidden 256, 4
  layers, vocabulary 4096, float32) with the word-level test tokenizer, in one directory.
- Requests: `--requests` (64) completions of prompts of token ids, lengths spread evenly from
  16 to 256, each asking `--max-tokens` (32) greedy tokens with `ignore_eos` (vLLM's; every
  reply is exactly that long, so both servers do the same work). Sent with the official
  `openai` client (AsyncOpenAI), non-streaming.
- One at a time: each request sent after the previous answer arrived. Concurrent: all of them
  at once. Throughput = completion tokens / wall time; latency = mean per request. One untimed
  request per prompt length first on each server (our engine compiles each prefill bucket on
  first use).
- Ours: `memagent-jax serve --slots S` (16) as its own process, the engine on CPU (float32).
- Naive transformers: the same model in `transformers`, behind the same HTTP stack (Starlette +
  uvicorn, its own process): each request is one `model.generate(do_sample=False)`, one at a
  time on one worker thread (what a server without a batching engine does), with
  `--torch-threads` (1) intra-op threads: on a 2-core machine with another job running, 2
  threads made every generate 14x slower (OpenMP's threads wait for each other while one is
  descheduled). `--no-transformers` skips it.

    python benchmarks/serve.py [--requests 64] [--max-tokens 32] [--slots 16] [--hidden 256]
        [--layers 4] [--vocab 4096] [--torch-threads 1] [--no-transformers]

The defaults take about 3 minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from machine import cpu_model_name  # beside this script


def start(command: list[str]) -> tuple[subprocess.Popen, str]:
    """A server process and its API base, read from the line it prints once bound."""
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "JAX_PLATFORMS": "cpu"})
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stderr],
                     daemon=True).start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            found = re.search(r"(http://127\.0\.0\.1:\d+/v1)", lines.get(timeout=1))
        except queue.Empty:
            if process.poll() is not None:
                raise RuntimeError(f"{command[:3]} exited with {process.returncode}") from None
            continue
        if found:
            return process, found.group(1)
    process.kill()
    raise TimeoutError(f"{command[:3]} did not start")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()


async def measure(url: str, prompts: list[list[int]], max_tokens: int) -> dict:
    import openai
    client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=3600)

    async def ask(prompt) -> tuple[int, float]:
        began = time.perf_counter()
        response = await client.completions.create(
            model="m", prompt=prompt, max_tokens=max_tokens, temperature=0,
            extra_body={"ignore_eos": True})
        return response.usage.completion_tokens, time.perf_counter() - began

    for _ in range(120):  # the server answers /v1/models once it is up
        try:
            await client.models.list()
            break
        except openai.APIConnectionError:
            await asyncio.sleep(0.5)
    for prompt in {len(p): p for p in prompts}.values():  # untimed: compile every bucket
        await ask(prompt)
    out = {}
    began = time.perf_counter()
    sequential = [await ask(p) for p in prompts]
    out["one at a time"] = (sequential, time.perf_counter() - began)
    began = time.perf_counter()
    concurrent = await asyncio.gather(*(ask(p) for p in prompts))
    out["concurrent"] = (concurrent, time.perf_counter() - began)
    return {mode: {"tokens_per_s": sum(t for t, _ in answers) / wall,
                   "latency_s": sum(s for _, s in answers) / len(answers), "wall_s": wall,
                   "tokens": sum(t for t, _ in answers)}
            for mode, (answers, wall) in out.items()}


def naive_server(model_dir: str, threads: int) -> None:
    """transformers' generate behind Starlette + uvicorn, one request at a time."""
    import concurrent.futures

    import torch
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    # One thread runs every generate: requests wait their turn, and torch's thread count is
    # that thread's setting.
    worker = concurrent.futures.ThreadPoolExecutor(1, initializer=torch.set_num_threads,
                                                   initargs=(threads,))

    def generate(prompt: list[int], max_tokens: int) -> list[int]:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens,
                                 min_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
        return out[0, len(prompt):].tolist()

    async def completions(request):
        body = await request.json()
        tokens = await asyncio.wrap_future(worker.submit(generate, body["prompt"],
                                                         body["max_tokens"]))
        return JSONResponse({"id": "x", "object": "text_completion", "created": 0,
                             "model": "m", "choices": [{"index": 0, "text": "",
                                                        "finish_reason": "length",
                                                        "logprobs": None}],
                             "usage": {"prompt_tokens": len(body["prompt"]),
                                       "completion_tokens": len(tokens),
                                       "total_tokens": len(body["prompt"]) + len(tokens)}})

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model",
                                                         "created": 0, "owned_by": "x"}]})

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                            Route("/v1/models", models)])
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    import socket
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(f"naive: http://127.0.0.1:{sock.getsockname()[1]}/v1", file=sys.stderr, flush=True)
    server.run(sockets=[sock])


def machine() -> str:
    name = cpu_model_name()
    return f"{os.cpu_count()}-core {platform.machine()} ({name}), load {os.getloadavg()[0]:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="the naive server's torch intra-op threads")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--naive-server", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.naive_server:
        return naive_server(args.naive_server, args.torch_threads)

    from tests.hf_reference import write_hf_model, write_tiny_tokenizer
    path = tempfile.mkdtemp(prefix="serve_bench_")
    try:
        write_tiny_tokenizer(path)
        write_hf_model(path, seed=0, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                       num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                       num_key_value_heads=max(1, args.hidden // 128),
                       vocab_size=args.vocab, max_position_embeddings=512)
        lengths = [16 + (240 * i) // max(1, args.requests - 1) for i in range(args.requests)]
        prompts = [[3 + (7 * i + k) % (args.vocab - 3) for k in range(n)]
                   for i, n in enumerate(lengths)]
        print(f"{machine()}; {args.requests} requests of {args.max_tokens} tokens, prompts of "
              f"16-256 tokens; model hidden {args.hidden}, {args.layers} layers, vocabulary "
              f"{args.vocab}, float32; torch threads {args.torch_threads}", flush=True)
        servers = {"memagent-jax serve": ["memagent-jax", "serve", "--model", path,
                                          "--served-model-name", "m", "--port", "0",
                                          "--slots", str(args.slots), "--max-len", "512",
                                          "--max-logprobs", "0", "--log-level", "warning"]}
        if not args.no_transformers:
            servers["transformers, naive"] = [sys.executable, os.path.abspath(__file__),
                                              "--naive-server", path, "--torch-threads",
                                              str(args.torch_threads)]
        results = {}
        for name, command in servers.items():
            process, url = start(command)
            try:
                results[name] = asyncio.run(measure(url, prompts, args.max_tokens))
            finally:
                stop(process)
            print(f"{name}: {results[name]}", flush=True)
        report(results, args.slots)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def report(results: dict, slots: int) -> None:
    print("\n| server | one at a time (tok/s) | 64 concurrent (tok/s) | concurrent / one at a "
          "time | mean latency, concurrent (s) |\n|---|---|---|---|---|")
    for name, r in results.items():
        one, many = r["one at a time"], r["concurrent"]
        label = f"{name} ({slots} slots)" if name.startswith("memagent") else name
        print(f"| {label} | {one['tokens_per_s']:.0f} | {many['tokens_per_s']:.0f} | "
              f"{many['tokens_per_s'] / one['tokens_per_s']:.2f}x | {many['latency_s']:.2f} |")
    if len(results) == 2:
        ours, peer = results.values()
        ratios = [ours[mode]["tokens_per_s"] / peer[mode]["tokens_per_s"]
                  for mode in ("one at a time", "concurrent")]
        print(f"| ours / transformers | {ratios[0]:.2f}x | {ratios[1]:.2f}x | | |")


if __name__ == "__main__":
    main()
