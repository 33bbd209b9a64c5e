"""`memagent-jax generate`: the engine on a file of prompts.

Standard library only at import (the CLI builds its parser from this module): JAX, the model
and the tokenizer load inside the command, after its flags and files are checked.
"""

from __future__ import annotations

import dataclasses
import math

from memagent_jax.commandline import (
    add_command,
    add_model_flags,
    from_flags,
    print_once,
    seed,
    start,
    stop_when_signalled,
    tokens,
)
from memagent_jax.distributed import collectives, startup  # stdlib-only at import
from memagent_jax.distributed.preemption import PreemptionNotice
from memagent_jax.errors import UserError
from memagent_jax.fileutil import check_output_file


def add_parsers(sub) -> None:
    """Registers `generate` on the CLI's subparsers."""
    p = add_command(sub, "generate", help="complete prompts from a JSONL file with the engine")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="HF, checkpoint or training run directory")
    p.add_argument("--input", required=True, metavar="IN.jsonl",
                   help='lines {"prompt": str} or {"prompt_ids": [int]}')
    p.add_argument("--out", "--output", required=True, metavar="OUT.jsonl",
                   help="a new file: one completion a line, in input order")
    p.add_argument("--max-new-tokens", type=tokens, default=256, help="tokens per completion")
    p.add_argument("--temperature", type=float, default=1.0, help="0 is greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling; 1: off")
    p.add_argument("--top-k", type=int, default=0, help="0: off")
    p.add_argument("--seed", type=seed, default=0, help="prompt i is sampled with seed + i")
    p.add_argument("--slots", type=int, default=8,
                   help="sequences decoded together (at most the number of prompts)")
    p.add_argument("--prefill-rows", type=int, default=1,
                   help="prompts prefilled together in one call (compiled for 1, 2, 4, ... up "
                        "to it)")
    p.add_argument("--max-len", type=tokens,
                   help="most KV entries per slot (default: longest prompt + max-new-tokens, "
                        "rounded up: powers of two to 256, then multiples of 256)")
    add_model_flags(p)
    p.set_defaults(func=_generate)
    startup.add_flags(p)


def _generate(args) -> None:
    from memagent_jax.console import progress_bar
    from memagent_jax.engine.engine_api import EngineConfig
    from memagent_jax.engine.factory import build_engine, load_model_section
    from memagent_jax.engine.jsonl import read_prompts, write_completions
    from memagent_jax.engine.sampling import SamplingParams
    from memagent_jax.engine.scheduler import Request, complete
    from memagent_jax.models.loading import read_config
    from memagent_jax.models.sharding import job_mesh

    if args.max_new_tokens <= 0:
        raise UserError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    check_sampling(args.temperature, args.top_p, args.top_k)
    engine_config = from_flags(EngineConfig, slots=args.slots, max_len=args.max_len,
                               prefill_rows=args.prefill_rows)
    check_output_file(args.out)
    model = model_section(args)
    # Optional (prompt_ids need none) unless --tokenizer names a directory to read it from.
    tokenizer = from_flags(model.load_tokenizer, required=args.tokenizer is not None)
    model_config = read_config(model.path)
    prompts = read_prompts(args.input, tokenizer, model_config.vocab_size)
    limit, what = ((args.max_len, "--max-len") if args.max_len else
                   (model_config.context_window, "the model's context window of"))
    for number, prompt in enumerate(prompts, start=1):
        if len(prompt) + args.max_new_tokens > limit:
            raise UserError(f"{args.input} prompt {number}: {len(prompt)} tokens do not fit "
                            f"{what} {limit} with --max-new-tokens {args.max_new_tokens} "
                            "(prompt + new tokens)")
    # A slot beyond the prompts would only decode an empty row, and hold its cache and its
    # sampling arrays (100,000 slots for 2 prompts took 6 GB and minutes).
    engine_config = dataclasses.replace(engine_config, slots=min(args.slots, len(prompts)))
    start(args)
    mesh = job_mesh(None)
    loaded = from_flags(load_model_section, section=model, tokenizer=tokenizer, mesh=mesh)
    longest = max(len(p) for p in prompts)
    engine = from_flags(build_engine, model=loaded.model, config=engine_config, mesh=mesh,
                        tokens=longest + args.max_new_tokens, key="max_new_tokens",
                        why=f"{args.max_new_tokens} with prompts of up to {longest} tokens")
    requests = [Request(tuple(p), args.max_new_tokens, SamplingParams(
        args.temperature, args.top_p, args.top_k, args.seed + i), loaded.stop_ids)
        for i, p in enumerate(prompts)]
    # Ctrl-C and SIGTERM only set the notice's flag while the engine runs; the next step
    # stops. A KeyboardInterrupt could land in an XLA compile, which goes on in XLA's threads
    # while the interpreter exits (a SIGSEGV at exit, 1 try in 3), or in a garbage-collection
    # callback, where Python drops it (the run went on to its end).
    with PreemptionNotice() as notice, progress_bar(
            total=len(requests), desc="generate", unit="prompt",
            disable=not collectives.is_main()) as bar:
        results = complete(engine, loaded.params, requests, on_done=lambda i, c: bar.update(1),
                           poll=stop_when_signalled(notice, lambda: (
                               f"nothing was written ({args.out} is written once every "
                               "prompt has finished)")))
    rows = []
    for (completion,) in results:
        text = (tokenizer.decode(completion.token_ids, skip_special_tokens=True)
                if tokenizer is not None else "")
        rows.append({"completion_ids": completion.token_ids, "text": text,
                     "logprobs": completion.logprobs,
                     "finish_reason": completion.finish_reason})
    collectives.on_main(write_completions, args.out, rows)
    print_once(f"wrote {len(rows)} completions to {args.out}")


def model_section(args):
    """The `model` section (engine.factory.ModelSection) from --model and `add_model_flags`'
    flags (generate, run, serve), those not given left to the section's defaults; its errors
    name the flags."""
    from memagent_jax.engine.model_section import ModelSection
    given = {"compute_dtype": args.dtype, "attention": args.attention, "lora": args.lora}
    return from_flags(ModelSection, path=args.model, tokenizer=args.tokenizer,
                      **{key: value for key, value in given.items() if value is not None})


def check_sampling(temperature: float, top_p: float, top_k: int = 0) -> None:
    """UserError naming the first sampling flag out of its range (NaN and infinity too)."""
    if not 0 <= temperature < math.inf:
        raise UserError(f"--temperature must be a number >= 0 (0 is greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise UserError(f"--top-p must be in (0, 1] (1: off), got {top_p}")
    if top_k < 0:
        raise UserError(f"--top-k must be >= 0 (0: off), got {top_k}")
