"""The `memagent-jax` command.

Every subcommand validates its input before touching devices; a `UserError` becomes one line on
stderr (`memagent-jax: error: ...`) and exit status 2, and outputs are written all-or-nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys

from memagent_jax import distributed  # stdlib-only at import
from memagent_jax.errors import ConfigError, Interrupted, UserError
from memagent_jax.fileutil import check_input_file, check_new_output, check_output_file


def _start(args, auto: bool = False) -> None:
    """Joins this process to its multi-process job, if it is one (memagent_jax.distributed);
    every process must run the same command line, bar the start-up flags."""
    launch = distributed.launch_from_flags(args, auto)
    skip = {"func", *(f.name for f in dataclasses.fields(launch)), "local_device_ids",
            "start_timeout", "distributed"}
    fingerprint = repr(sorted((k, v) for k, v in vars(args).items() if k not in skip))
    distributed.start(launch, fingerprint)


def _convert(args) -> None:
    from memagent_jax.models import job_mesh, load_model, save_checkpoint
    check_new_output(args.out)
    _start(args)
    model, config = load_model(args.hf, dtype=None, mesh=job_mesh(None))
    save_checkpoint(model, config, args.out, side_files_dir=args.hf)
    _print_once(f"converted {args.hf} -> {args.out} ({config.num_layers} layers, {config.dtype})")


def _export(args) -> None:
    from memagent_jax import pretrained
    from memagent_jax.models import job_mesh, load_model, save_hf
    from memagent_jax.models.checkpoint import is_checkpoint_directory, side_files_dir
    max_shard_bytes = _parse_size(args.max_shard_size)
    check_new_output(args.out)
    source = pretrained.resolve(args.ckpt)
    if is_checkpoint_directory(source):
        side_files = side_files_dir(source)
    elif source != args.ckpt:  # a shipped model: an HF directory, re-exported (resharded)
        side_files = source
    else:
        raise UserError(f"{args.ckpt}: not a memagent-jax checkpoint (a `memagent-jax convert` "
                        "output, or a training run's output, checkpoints or step directory)")
    _start(args)
    model, config = load_model(source, dtype=None, mesh=job_mesh(None))
    save_hf(model, config, args.out, tokenizer_dir=side_files, max_shard_bytes=max_shard_bytes)
    _print_once(f"exported {args.ckpt} -> {args.out}")


def _random_model(args) -> None:
    import tempfile

    from memagent_jax.data.needle import write_tokenizer
    from memagent_jax.models import preset_config, random_model, save_hf
    max_shard_bytes = _parse_size(args.max_shard_size)
    check_new_output(args.out)
    config = preset_config(args.preset, dtype=args.dtype)
    with tempfile.TemporaryDirectory() as tokenizer_dir:
        # A word-level tokenizer with a chat template, so that `run` and text prompts work on
        # the model as they would on a real one (its few hundred ids fit every preset).
        write_tokenizer(tokenizer_dir)
        save_hf(random_model(config, seed=args.seed), config, args.out,
                tokenizer_dir=tokenizer_dir, max_shard_bytes=max_shard_bytes)
    print(f"wrote a random-weight {args.preset} model ({args.dtype}) with a word-level "
          f"tokenizer to {args.out}")


def _generate(args) -> None:
    from tqdm import tqdm

    from memagent_jax.models import job_mesh, read_config
    from memagent_jax.rollout.agent import ModelSection, build_engine, load_policy
    from memagent_jax.rollout.engine import EngineConfig
    from memagent_jax.rollout.jsonl import read_prompts, write_completions
    from memagent_jax.rollout.sampling import SamplingParams
    from memagent_jax.rollout.scheduler import Request, complete

    if args.max_new_tokens <= 0:
        raise UserError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    if args.temperature < 0 or not 0 < args.top_p <= 1 or args.top_k < 0:
        raise UserError("--temperature must be >= 0, --top-p in (0, 1], --top-k >= 0")
    engine_config = _from_flags(EngineConfig, slots=args.slots, max_len=args.max_len,
                                prefill_rows=args.prefill_rows)
    check_output_file(args.output)
    model = _from_flags(ModelSection, path=args.model, tokenizer=args.tokenizer,
                        compute_dtype=args.dtype, attention=args.attention)
    tokenizer = _from_flags(model.load_tokenizer, required=False)
    model_config = read_config(model.path)
    prompts = read_prompts(args.input, tokenizer, model_config.vocab_size)
    limit, what = ((args.max_len, "--max-len") if args.max_len else
                   (model_config.context_window, "the model's context window of"))
    for number, prompt in enumerate(prompts, start=1):
        if len(prompt) + args.max_new_tokens > limit:
            raise UserError(f"{args.input} prompt {number}: {len(prompt)} tokens do not fit "
                            f"{what} {limit} with --max-new-tokens {args.max_new_tokens} "
                            "(prompt + new tokens)")
    _start(args)
    mesh = job_mesh(None)
    policy = _from_flags(load_policy, section=model, tokenizer=tokenizer, mesh=mesh)
    engine = build_engine(policy.model, engine_config, mesh,
                          max(len(p) for p in prompts) + args.max_new_tokens)
    requests = [Request(tuple(p), args.max_new_tokens, SamplingParams(
        args.temperature, args.top_p, args.top_k, args.seed + i), policy.stop_ids)
        for i, p in enumerate(prompts)]
    try:
        with tqdm(total=len(requests), desc="generate", unit="prompt", file=sys.stderr,
                  disable=not distributed.is_main()) as bar:
            results = complete(engine, policy.params, requests,
                               on_done=lambda i, c: bar.update(1))
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; nothing was written ({args.output} is written once "
                          "every prompt has finished)") from None
    rows = []
    for (completion,) in results:
        text = (tokenizer.decode(completion.token_ids, skip_special_tokens=True)
                if tokenizer is not None else "")
        rows.append({"completion_ids": completion.token_ids, "text": text,
                     "logprobs": completion.logprobs,
                     "finish_reason": completion.finish_reason})
    distributed.on_main(write_completions, args.output, rows)
    _print_once(f"wrote {len(rows)} completions to {args.output}")


def _run(args) -> None:
    import json

    from tqdm import tqdm

    from memagent_jax import pretrained
    from memagent_jax.rollout.memagent import MemAgentConfig, read_sample
    from memagent_jax.tokenizer import load_tokenizer

    model_dir = None if args.url else pretrained.resolve(os.path.expanduser(args.model))
    config = _from_flags(MemAgentConfig, **pretrained.budgets(
        model_dir, chunk_tokens=args.chunk_tokens,
        max_memory_tokens=args.max_memory_tokens, max_final_tokens=args.max_final_tokens))
    document = _read_document(args.doc)
    if args.url:  # --model names the served model; the tokenizer chunks the document
        tokenizer_dir = args.tokenizer or args.model
        tokenizer = load_tokenizer(tokenizer_dir) if os.path.isdir(tokenizer_dir) else None
        if tokenizer is None:
            raise UserError(f"{tokenizer_dir}: no tokenizer files (tokenizer.json) to chunk "
                            "the document with; pass --tokenizer DIR")
    else:
        from memagent_jax.rollout.agent import ModelSection
        model = _from_flags(ModelSection, path=args.model, tokenizer=args.tokenizer,
                            compute_dtype=args.dtype, attention=args.attention)
        tokenizer = _from_flags(model.load_tokenizer, required=True)
    sample = read_sample(tokenizer, args.question, document, config)
    if not args.url:
        _start(args)
    with tqdm(total=len(sample.chunks) + 1, desc="chunks", unit="turn", file=sys.stderr,
              disable=not distributed.is_main()) as bar:

        def show(kind: str, reply: str) -> None:
            bar.update(1)
            if args.verbose:
                tqdm.write(f"--- {kind} turn {bar.n}/{bar.total}:\n{reply}", file=sys.stderr)

        if args.url:
            from memagent_jax.rollout.server import run_on_server
            record = run_on_server(args.url, args.model, sample, tokenizer,
                                   max_memory_tokens=config.max_memory_tokens,
                                   max_final_tokens=config.max_final_tokens,
                                   temperature=args.temperature, top_p=args.top_p,
                                   api_key=os.environ.get("API_KEY"), timeout=args.timeout,
                                   on_turn=lambda n, kind, reply: show(kind, reply))
        else:
            record = _run_locally(args, model, config, tokenizer, sample, show)
    if args.json:  # one JSON document on stdout, the answer in it
        _print_once(json.dumps(record, ensure_ascii=False, indent=2))
    else:
        answer = record["answer"]
        _print_once(answer if answer is not None else record["final_reply"].strip())


def _run_locally(args, model, config, tokenizer, sample, show) -> dict:
    import dataclasses

    from memagent_jax.models import job_mesh
    from memagent_jax.rollout.agent import build_agent, load_policy
    from memagent_jax.rollout.engine import EngineConfig
    from memagent_jax.rollout.sampling import SamplingParams

    mesh = job_mesh(None)
    policy = _from_flags(load_policy, section=model, tokenizer=tokenizer, mesh=mesh)
    agent = build_agent(policy.model, tokenizer, config, EngineConfig(slots=1), mesh,
                        policy.stop_ids)
    sampling = SamplingParams(args.temperature, args.top_p, seed=args.seed)
    (trajectory,) = agent.run(policy.params, [sample], sampling,
                              on_turn=lambda i, turn: show(turn.kind, turn.reply))[0]
    record = dataclasses.asdict(trajectory)
    record.update(memories=trajectory.memories, final_reply=trajectory.final_reply)
    return record


def _demo(args) -> None:
    from memagent_jax.synthetic.demo import parse_length, run_demo
    length = parse_length(args.length)
    _start(args)
    run_demo(args.model, args.task, length, args.seed, args.show,
             {"chunk_tokens": args.chunk_tokens, "max_memory_tokens": args.max_memory_tokens,
              "max_final_tokens": args.max_final_tokens})


def _trace(args) -> None:
    from memagent_jax.synthetic.demo import parse_length
    length = parse_length(args.length)
    budgets = {"chunk_tokens": args.chunk_tokens, "max_memory_tokens": args.max_memory_tokens,
               "max_final_tokens": args.max_final_tokens}
    if args.carries:
        from memagent_jax.synthetic.carries import run_carries
        if args.out:
            raise UserError("--out: trace --carries prints its scores and writes no file")
        run_carries(args.model, args.task, length, args.seed, args.num_samples, budgets)
        return
    from memagent_jax.synthetic.trace import run_trace
    _start(args)
    run_trace(args.model, args.task, length, args.seed, args.num_samples, budgets, args.slots,
              args.out)


def _serve(args) -> None:
    from memagent_jax.models import job_mesh, read_config
    from memagent_jax.rollout.agent import ModelSection, build_engine, load_policy
    from memagent_jax.rollout.engine import EngineConfig
    from memagent_jax.serve.command import (OpenAIServer, check_single_host, parse_mesh,
                                            require_http_stack, served_names)

    check_single_host()
    require_http_stack()
    for flag, value, low in (("--max-logprobs", args.max_logprobs, 0),
                             ("--max-requests", args.max_requests, 1),
                             ("--shutdown-timeout", args.shutdown_timeout, 0)):
        if value < low:
            raise UserError(f"{flag} must be at least {low}, got {value}")
    model = _from_flags(ModelSection, path=args.model, tokenizer=args.tokenizer,
                        compute_dtype=args.dtype, attention=args.attention)
    tokenizer = _from_flags(model.load_tokenizer, required=True)
    model_config = read_config(model.path)
    max_len = args.max_len or model_config.context_window
    engine_config = _from_flags(EngineConfig, slots=args.slots, max_len=args.max_len,
                                prefill_rows=args.prefill_rows,
                                top_logprobs=min(args.max_logprobs, model_config.vocab_size))
    mesh = job_mesh(parse_mesh(args.mesh), source="--mesh")
    policy = _from_flags(load_policy, section=model, tokenizer=tokenizer, mesh=mesh)
    engine = build_engine(policy.model, engine_config, mesh, max_len)
    names = served_names(args.model, args.served_model_name)
    server = OpenAIServer(policy, engine, names=names, max_len=max_len, host=args.host,
                          port=args.port,
                          api_key=args.api_key or os.environ.get("MEMAGENT_API_KEY"),
                          max_requests=args.max_requests,
                          shutdown_timeout=args.shutdown_timeout, log_level=args.log_level)
    print(f"memagent-jax serve: {server.url} ({', '.join(names)}; "
          f"{args.slots} slots, {max_len} tokens per request)", file=sys.stderr, flush=True)
    server.run()


def _curves(args) -> None:
    from memagent_jax.rl.curves import plot_curves
    check_output_file(args.out)
    if args.names and len(args.names) != len(args.runs):
        raise UserError(f"--names: {len(args.names)} names for {len(args.runs)} runs")
    plot_curves(args.runs, args.out, tuple(args.tags), args.names)
    print(f"wrote {args.out}")


def _train(args) -> None:
    from memagent_jax.rl.config import load_train_config
    config = load_train_config(args.config, args.overrides)  # every key checked, no device yet
    _start(args, auto=config.distributed)
    from memagent_jax.rl.trainer import train
    train(config)


def _print_once(line: str) -> None:
    """A result line on stdout, from process 0 only (every process of a job computes it)."""
    if distributed.is_main():
        print(line)


def _read_document(path: str) -> str:
    check_input_file(path)
    data = open(path, "rb").read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (invalid byte at offset {e.start})") from None
    if not text.strip():
        raise UserError(f"{path}: the document is empty")
    return text


def _from_flags(build, **flags):
    """build(**flags) (a config section, or a section's method), its ConfigErrors named by the
    command's flags: engine.max_len -> --max-len, model.path -> --model."""
    try:
        return build(**flags)
    except ConfigError as e:
        name = e.key.rsplit(".", 1)[-1]
        flag = "--model" if name == "path" else "--" + name.replace("_", "-")
        raise UserError(f"{flag} {e.message}") from None


def _parse_size(text: str) -> int:
    units = {"KB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3, "B": 1}
    for unit, scale in units.items():
        if text.upper().endswith(unit):
            number = text[: -len(unit)]
            break
    else:
        number, scale = text, 1
    try:
        size = int(float(number) * scale)
    except (ValueError, OverflowError):  # not a number; inf
        size = 0
    if size <= 0:
        raise UserError(f"--max-shard-size: expected a size such as 5GB or 500MB, got {text!r}")
    return size


def _eval(args) -> None:
    from memagent_jax.eval.runner import main as eval_main
    _start(args)
    eval_main(args.config, args.overrides)


class _HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows every option's default (those that have one)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    """The `model` section's flags besides --model (see rollout.agent.ModelSection)."""
    p.add_argument("--tokenizer", metavar="DIR",
                   help="tokenizer directory (default: the model's; with `run --url`, the "
                        "one that chunks the document)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"),
                   help="the weights' and compute dtype (default: float32 on CPU, bfloat16 "
                        "on GPU/TPU)")
    p.add_argument("--attention", default="xla",
                   help="how prompts attend: xla, dot_product, cudnn (GPU), splash (TPU)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memagent-jax",
        description="MemAgent on JAX: Qwen2.5 models, the chunk-memory loop, DAPO training.")
    sub = parser.add_subparsers(dest="command", required=True)
    add = functools.partial(sub.add_parser, formatter_class=_HelpWithDefaults)

    p = add("convert", help="HF safetensors directory -> memagent-jax checkpoint")
    p.add_argument("--hf", required=True, metavar="HF_DIR", help="config.json + *.safetensors")
    p.add_argument("--out", required=True, metavar="CKPT_DIR", help="new checkpoint directory")
    p.set_defaults(func=_convert)
    distributed.add_flags(p)

    p = add("export", help="memagent-jax checkpoint -> HF safetensors directory")
    p.add_argument("--ckpt", required=True, metavar="CKPT_DIR",
                   help="a `convert` output, a training run's output directory (its newest "
                        "step), checkpoints directory or step directory, or a shipped model's "
                        "name (memagent_jax/pretrained)")
    p.add_argument("--out", required=True, metavar="HF_DIR", help="new (or empty) directory")
    p.add_argument("--max-shard-size", default="5GB",
                   help="split weights into files of at most this size, with an index")
    p.set_defaults(func=_export)
    distributed.add_flags(p)

    p = add("generate", help="complete prompts from a JSONL file with the engine")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="HF, checkpoint or training run directory")
    p.add_argument("--input", required=True, metavar="IN.jsonl",
                   help='lines {"prompt": str} or {"prompt_ids": [int]}')
    p.add_argument("--output", required=True, metavar="OUT.jsonl")
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens per completion")
    p.add_argument("--temperature", type=float, default=1.0, help="0 is greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling; 1: off")
    p.add_argument("--top-k", type=int, default=0, help="0: off")
    p.add_argument("--seed", type=int, default=0, help="prompt i is sampled with seed + i")
    p.add_argument("--slots", type=int, default=8, help="sequences decoded together")
    p.add_argument("--prefill-rows", type=int, default=1,
                   help="prompts prefilled together in one call (compiled for 1, 2, 4, ... up "
                        "to it)")
    p.add_argument("--max-len", type=int,
                   help="KV cache length per slot (default: longest prompt + max-new-tokens, "
                        "rounded up: powers of two to 256, then multiples of 256)")
    _add_model_flags(p)
    p.set_defaults(func=_generate)
    distributed.add_flags(p)

    p = add("run", help="answer a question about a long document with the memory agent (the "
                        "quickstart)")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="HF, checkpoint or training run directory (with --url: the served "
                        "model's name)")
    p.add_argument("--doc", required=True, metavar="FILE", help="UTF-8 text of any length")
    p.add_argument("--question", required=True)
    p.add_argument("--chunk-tokens", type=int,
                   help="document tokens per turn (default: the model's memagent.json, else "
                        "5000)")
    p.add_argument("--max-memory-tokens", type=int,
                   help="the longest memory a turn may write (default: the model's, else 1024)")
    p.add_argument("--max-final-tokens", type=int,
                   help="the longest final answer (default: the model's, else 1024)")
    p.add_argument("--temperature", type=float, default=0.7, help="0 is greedy")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling; 1: off")
    p.add_argument("--seed", type=int, default=0, help="the sampling seed")
    p.add_argument("--json", action="store_true",
                   help="print the whole record (every turn) as one JSON document")
    p.add_argument("--verbose", action="store_true", help="print every turn's memory")
    p.add_argument("--url", help="OpenAI-compatible API base URL (key in env API_KEY) "
                                 "instead of the local engine")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request (--url)")
    _add_model_flags(p)
    p.set_defaults(func=_run)
    distributed.add_flags(p)

    p = add("demo", help="the shipped memory agent reads a fresh synthetic document of any "
                         "length and answers")
    p.add_argument("--model", default="memagent-tiny", metavar="NAME_OR_PATH",
                   help="a model trained on the synthetic tasks (docs/synthetic.md): a "
                        "directory or a shipped model's name (default: memagent-tiny)")
    p.add_argument("--length", default="300K",
                   help="document tokens: 300000, 300K, 1M, ... (at least one chunk)")
    p.add_argument("--task", default="multikey", help="multikey or twohop")
    p.add_argument("--seed", type=int, help="the document's seed (default: a random one)")
    p.add_argument("--show", type=int, default=6, help="memory changes to print")
    p.add_argument("--chunk-tokens", type=int, help="default: the model's (memagent.json)")
    p.add_argument("--max-memory-tokens", type=int, help="default: the model's")
    p.add_argument("--max-final-tokens", type=int, help="default: the model's")
    p.set_defaults(func=_demo)
    distributed.add_flags(p)

    p = add("trace", help="where the memory goes wrong: a memory agent reads fresh synthetic "
                          "documents, and each needed fact is followed turn by turn")
    p.add_argument("--model", default="memagent-tiny", metavar="NAME_OR_PATH",
                   help="a model trained on the synthetic tasks: a directory or a shipped "
                        "model's name")
    p.add_argument("--length", default="8K",
                   help="document tokens: 8192, 8K (8000), 1M, ...")
    p.add_argument("--task", default="multikey", help="multikey or twohop")
    p.add_argument("--num-samples", type=int, default=32, help="documents read")
    p.add_argument("--seed", type=int, default=777,
                   help="the documents' seed (the recipe's data: seeds 1-5; its evaluation: 9)")
    p.add_argument("--slots", type=int, default=16, help="documents read together")
    p.add_argument("--out", metavar="FILE.jsonl", help="also write the traces, one a line")
    p.add_argument("--carries", action="store_true",
                   help="instead of reading: score every turn that should keep the memory as "
                        "it is, teacher-forced, and count those the model would rewrite "
                        "(one process)")
    p.add_argument("--chunk-tokens", type=int, help="default: the model's (memagent.json)")
    p.add_argument("--max-memory-tokens", type=int, help="default: the model's")
    p.add_argument("--max-final-tokens", type=int, help="default: the model's")
    p.set_defaults(func=_trace)
    distributed.add_flags(p)

    p = add("serve", help="an OpenAI-compatible HTTP server on the engine (/v1/chat/"
                          "completions, /v1/completions, /v1/models)")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="HF, checkpoint or training run directory")
    p.add_argument("--served-model-name", nargs="+", metavar="NAME",
                   help="the names requests use (default: --model as given, and its last "
                        "path component)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="0: any free port")
    p.add_argument("--api-key", help="required of clients (Authorization: Bearer KEY); "
                                     "default: env MEMAGENT_API_KEY, else none")
    p.add_argument("--slots", type=int, default=8, help="sequences decoded together")
    p.add_argument("--max-len", type=int,
                   help="the longest prompt + reply served, the KV cache length of every "
                        "slot (default: the model's context window)")
    p.add_argument("--prefill-rows", type=int, default=1,
                   help="prompts prefilled together in one call")
    p.add_argument("--max-logprobs", type=int, default=20,
                   help="the most top_logprobs a request may ask (0: no alternatives)")
    p.add_argument("--max-requests", type=int, default=1024,
                   help="requests in flight (decoding or waiting for a slot); more get 429")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish after SIGTERM/SIGINT")
    p.add_argument("--mesh", metavar="AXIS=SIZE,...",
                   help="spread the model over this host's devices, e.g. fsdp=-1,tensor=4 "
                        "(default: one device)")
    p.add_argument("--log-level", default="info",
                   choices=("critical", "error", "warning", "info", "debug"))
    _add_model_flags(p)
    p.set_defaults(func=_serve)

    p = add("random-model", help="write an HF directory with random weights in a Qwen2.5 "
                                 "shape, and a word-level tokenizer")
    p.add_argument("--preset", default="tiny", help="tiny, qwen2.5-0.5b, ..., qwen2.5-72b")
    p.add_argument("--out", required=True, metavar="HF_DIR")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="the stored weights' dtype")
    p.add_argument("--seed", type=int, default=0, help="the weights' random seed")
    p.add_argument("--max-shard-size", default="5GB",
                   help="split weights into files of at most this size, with an index")
    p.set_defaults(func=_random_model)

    p = add("train", help="train the memory agent with multi-conversation DAPO (resumes from "
                          "the newest checkpoint in the run's output)")
    p.add_argument("--config", required=True, metavar="YAML", help="e.g. configs/tiny_cpu.yaml")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted overrides, e.g. learner.lr=1e-6 steps=10")
    p.set_defaults(func=_train)
    distributed.add_flags(p)

    from memagent_jax.rl.curves import DEFAULT_TAGS  # stdlib-only at import
    p = add("curves", help="training curves of runs (their TensorBoard scalars), one after "
                           "another, as a PNG")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="training output directories")
    p.add_argument("--out", required=True, metavar="PNG")
    p.add_argument("--tags", nargs="+", default=list(DEFAULT_TAGS), help="scalars to draw")
    p.add_argument("--names", nargs="+", help="the runs' legend names (default: directories)")
    p.set_defaults(func=_curves)

    p = add("eval", help="evaluate the memory agent (or the full-context baseline) over "
                         "context lengths; an interrupted eval resumes")
    p.add_argument("--config", required=True, metavar="YAML",
                   help="e.g. configs/eval_ruler_hqa_memagent_14b.yaml")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted overrides, e.g. sampling.n=4 data.max_samples=16")
    p.set_defaults(func=_eval)
    distributed.add_flags(p)

    from memagent_jax.data import command as data_command  # stdlib-only at import
    data_command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except UserError as e:
        print(f"memagent-jax: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the file system refused (disk full, permissions): one line as well
        print(f"memagent-jax: error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:
        print(f"memagent-jax: {e}", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
