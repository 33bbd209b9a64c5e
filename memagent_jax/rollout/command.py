"""`memagent-jax run`: the memory agent on one long document (the quickstart), or another agent
on one question.

Standard library only at import (the CLI builds its parser from this module): JAX, the model
and the tokenizer load inside the command, after its flags and files are checked.
"""

from __future__ import annotations

import math
import os
import sys

from memagent_jax.commandline import (
    add_command,
    add_model_flags,
    from_flags,
    print_once,
    seed,
    start,
    tokens,
)
from memagent_jax.distributed import collectives, startup  # stdlib-only at import
from memagent_jax.engine.command import check_sampling, model_section  # stdlib-only at import
from memagent_jax.errors import UserError
from memagent_jax.fileutil import check_input_file
from memagent_jax.rollout.thinking import THINKING_CHOICES  # stdlib-only


def add_parsers(sub) -> None:
    """Registers `run` on the CLI's subparsers."""
    p = add_command(sub, "run", help="answer a question about a long document with the memory "
                                     "agent (the quickstart)")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="HF, checkpoint or training run directory (with --url: the served "
                        "model's name)")
    p.add_argument("--doc", metavar="FILE", help="UTF-8 text of any length (MemAgent: required; "
                                                 "another agent: the row's context)")
    p.add_argument("--question", required=True)
    p.add_argument("--agent", metavar="MODULE|{module: ..., ...}",
                   help="another agent than MemAgent (docs/agents.md): its module, or its "
                        "config section as a YAML mapping; the question is its row's prompt")
    p.add_argument("--max-len", type=tokens,
                   help="with --agent: the engine's most tokens a conversation takes (default: "
                        "the agent's own max_len)")
    p.add_argument("--chunk-tokens", type=tokens,
                   help="document tokens per turn (default: the model's memagent.json, else "
                        "5000)")
    p.add_argument("--max-memory-tokens", type=tokens,
                   help="the longest memory a turn may write (default: the model's, else 1024)")
    p.add_argument("--max-final-tokens", type=tokens,
                   help="the longest final answer (default: the model's, else 1024)")
    p.add_argument("--thinking", choices=THINKING_CHOICES,
                   help="a thinking model's <think>...</think> (Qwen3): keep it in the memory, "
                        "strip it from the memory, or turn thinking off in the chat template "
                        "(default: the model's memagent.json, else keep)")
    p.add_argument("--temperature", type=float, default=0.7, help="0 is greedy")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling; 1: off")
    p.add_argument("--seed", type=seed, default=0, help="the sampling seed")
    p.add_argument("--json", action="store_true",
                   help="print the whole record (every turn) as one JSON document")
    p.add_argument("--verbose", action="store_true", help="print every turn's memory")
    p.add_argument("--url", help="OpenAI-compatible API base URL instead of the local engine "
                                 "(key in env MEMAGENT_API_KEY, else API_KEY)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request (--url)")
    add_model_flags(p, "tokenizer directory (default: the model's; with --url, the one that "
                       "chunks the document)")
    p.set_defaults(func=_run)
    startup.add_flags(p)


def _run(args) -> None:
    import json

    from tqdm import tqdm

    given = [flag for flag, value in (("--dtype", args.dtype), ("--attention", args.attention))
             if value is not None]
    if args.url and given:
        raise UserError(f"{' and '.join(given)}: the --url server runs the model; the "
                        "local engine's settings do not apply to it")
    if args.agent is not None:
        return _run_agent(args)
    if args.doc is None:
        raise UserError("--doc is required (MemAgent reads a document; another agent: --agent)")
    if args.max_len is not None:
        raise UserError("--max-len is --agent's (MemAgent sizes its engine from its budgets)")

    from memagent_jax.agents.memagent.config import MemAgentConfig
    from memagent_jax.console import progress_bar
    from memagent_jax.model_dir import resolve
    from memagent_jax.tokenizer import load_tokenizer

    check_sampling(args.temperature, args.top_p)
    if not 0 < args.timeout < math.inf:
        raise UserError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    # With --url, --model names the served model and the tokenizer's directory (the model's,
    # as a rule) holds the budgets it was trained with (memagent.json), as the model's does.
    model_dir = resolve(os.path.expanduser(
        (args.tokenizer or args.model) if args.url else args.model))
    config = from_flags(MemAgentConfig.from_model, model_path=model_dir,
                        chunk_tokens=args.chunk_tokens, max_memory_tokens=args.max_memory_tokens,
                        max_final_tokens=args.max_final_tokens, thinking=args.thinking)
    document = _read_document(args.doc)
    if args.url:  # the tokenizer chunks the document
        tokenizer_dir = model_dir
        tokenizer = load_tokenizer(tokenizer_dir) if os.path.isdir(tokenizer_dir) else None
        if tokenizer is None:
            raise UserError(f"{tokenizer_dir}: no tokenizer files (tokenizer.json) to chunk "
                            "the document with; pass --tokenizer DIR")
    else:
        model = model_section(args)
        tokenizer = from_flags(model.load_tokenizer, required=True)
    sample = _interruptible(_checked_sample, tokenizer, args.question, document, args.doc,
                            config)
    if not args.url:
        start(args)
        agent, params = _local_agent(model, config, tokenizer, sample)
    with progress_bar(total=len(sample.chunks) + 1, desc="chunks", unit="turn",
                      disable=not collectives.is_main()) as bar:

        def show(kind: str, reply: str) -> None:
            bar.update(1)
            if args.verbose:
                tqdm.write(f"--- {kind} turn {bar.n}/{bar.total}:\n{reply}", file=sys.stderr)

        if args.url:
            from memagent_jax.agents.memagent.agent import MemAgent
            from memagent_jax.rollout.client import run_on_server

            agent = _Shown(MemAgent(config, tokenizer), show)
            (trajectory,), = run_on_server(_server(args), agent, [sample], [[None]])
        else:
            trajectory = _run_locally(args, agent, params, sample, show)
        record = trajectory.record()
    if args.json:  # one JSON document on stdout, the answer in it
        print_once(json.dumps(record, ensure_ascii=False, indent=2))
    else:
        # Stripped: a word-level tokenizer decodes with a space before every word.
        answer = record["answer"]
        print_once((answer if answer is not None else record["final_reply"]).strip())


def _run_agent(args) -> None:
    """`run --agent`: one rollout of the agent on a row of --question (and --doc as its
    context), on the local engine or the --url server; prints the answer (or --json: the
    record, each conversation's messages in it)."""
    import json

    import yaml

    from memagent_jax.data.pipeline import Example
    from memagent_jax.engine.sampling import SamplingParams
    from memagent_jax.errors import ConfigError
    from memagent_jax.rollout.agent_api import load_agent
    from memagent_jax.runconfig import load_yaml

    check_sampling(args.temperature, args.top_p)
    for flag in ("chunk_tokens", "max_memory_tokens", "max_final_tokens", "thinking"):
        if getattr(args, flag) is not None:
            raise UserError(f"--{flag.replace('_', '-')} is MemAgent's; --agent takes its "
                            "settings in its section")
    try:
        section = load_yaml(args.agent)
    except yaml.YAMLError as e:
        raise UserError(f"--agent: not a module name nor a YAML mapping ({e})") from None
    section = {"module": section} if isinstance(section, str) else section
    if not isinstance(section, dict):
        raise UserError(f"--agent: expected a module name or {{module: ..., ...}}, got "
                        f"{args.agent!r}")
    try:
        agent = load_agent(section, None)
    except ConfigError as e:
        raise UserError(f"--agent: {e}") from None
    if not args.question.strip():
        raise UserError("--question: the question is empty")
    context = _read_document(args.doc) if args.doc else ""
    prompt = ({"role": "user", "content": args.question},)
    row = Example(0, "", args.question, context, (), prompt=prompt,
                  fields={"prompt": list(prompt), "context": context})
    if args.url:
        from memagent_jax.rollout.client import run_on_server

        (trajectory,), = run_on_server(_server(args), agent, [row], [[None]])
    else:
        from memagent_jax.engine.engine_api import EngineConfig
        from memagent_jax.engine.factory import load_policy
        from memagent_jax.models.sharding import job_mesh
        from memagent_jax.rollout.runner import build_runner

        model = model_section(args)
        tokenizer = from_flags(model.load_tokenizer, required=True)
        start(args)
        mesh = job_mesh(None)
        policy = from_flags(load_policy, section=model, tokenizer=tokenizer, mesh=mesh)
        runner = from_flags(build_runner, agent=agent, model=policy.model,
                            tokenizer=tokenizer, engine=EngineConfig(slots=1,
                                                                     max_len=args.max_len),
                            mesh=mesh, stop_ids=policy.stop_ids)
        (trajectory,), = runner.with_params(policy.params).run(
            agent, [row], SamplingParams(args.temperature, args.top_p, seed=args.seed))
    record = trajectory.record()
    if args.verbose:
        for turn in trajectory.turns:
            for message in turn.messages or []:
                print(f"--- {message['role']}:\n{message['content']}", file=sys.stderr)
    if args.json:
        print_once(json.dumps(record, ensure_ascii=False, indent=2))
    else:
        answer = record["answer"]
        print_once((answer if answer is not None else record["final_reply"]).strip())


def _server(args):
    """`run --url`'s server: --model the served model's name, the key in the environment,
    --timeout, and the sampling flags."""
    from memagent_jax.rollout.client import Server, api_key_from_env

    return Server(args.url, args.model, api_key_from_env(), args.timeout, args.temperature,
                  args.top_p)


def _local_agent(model, config, tokenizer, sample):
    """(the memory agent, its parameters) for one sample, on this job's devices: the cache
    sized for this sample's turns (`build_agent`'s sample), not the longest the budgets allow."""
    from memagent_jax.agents.memagent.agent import build_agent
    from memagent_jax.engine.engine_api import EngineConfig
    from memagent_jax.engine.factory import load_policy
    from memagent_jax.models.sharding import job_mesh

    mesh = job_mesh(None)
    policy = from_flags(load_policy, section=model, tokenizer=tokenizer, mesh=mesh)
    agent = from_flags(build_agent, model=policy.model, tokenizer=tokenizer, memagent=config,
                       engine=EngineConfig(slots=1), mesh=mesh, stop_ids=policy.stop_ids,
                       sample=sample)
    return agent, policy.params


def _run_locally(args, agent, params, sample, show):
    from memagent_jax.engine.sampling import SamplingParams

    sampling = SamplingParams(args.temperature, args.top_p, seed=args.seed)
    (trajectory,) = agent.run(params, [sample], sampling,
                              on_turn=lambda i, turn: show(turn.kind, turn.reply))[0]
    return trajectory


class _Shown:
    """An agent whose every turn is shown (`run --verbose`, the progress bar)."""

    def __init__(self, agent, show):
        self.agent, self.show, self.name = agent, show, agent.name

    async def rollout(self, row, policy):
        return await self.agent.rollout(row, policy,
                                        lambda turn: self.show(turn.kind, turn.reply))


def _checked_sample(tokenizer, question: str, document: str, doc_path: str, config):
    """`read_sample`, after refusing words the tokenizer cannot represent."""
    from memagent_jax.agents.memagent.reading import read_sample
    from memagent_jax.tokenizer import check_representable

    check_representable(tokenizer, question, "--question")
    check_representable(tokenizer, document, doc_path)
    return read_sample(tokenizer, question, document, config)


def _interruptible(fn, *args):
    """fn(*args) on a thread of its own; its result, or its exception raised here.

    Tokenizing a long document is one call into the tokenizer's Rust library (tens of seconds
    for 35 MB on a 2-core CPU), and Python runs a signal handler only between bytecodes of the
    main thread: Ctrl-C there would wait for the call to end. The library releases the GIL
    while it encodes, so the main thread, waiting here (an interruptible wait), raises
    KeyboardInterrupt at once; the daemon thread is left to end with the process.
    """
    import threading

    outcome = {}

    def target():
        try:
            outcome["result"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - raised again on the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=target, name=getattr(fn, "__name__", "work"), daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _read_document(path: str) -> str:
    """`run --doc`'s text; UserError for a missing, non-UTF-8 or empty file."""
    check_input_file(path)
    data = open(path, "rb").read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (invalid byte at offset {e.start})") from None
    if not text.strip():
        raise UserError(f"{path}: the document is empty")
    return text
