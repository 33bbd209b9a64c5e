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
    p.add_argument("--show-tokens", action="store_true",
                   help="print each conversation as it would be trained: its text and ids, "
                        "the trained (generated) tokens between \u27e6 \u27e7, then the answer")
    p.add_argument("--url", help="OpenAI-compatible API base URL instead of the local engine "
                                 "(key in env MEMAGENT_API_KEY, else API_KEY)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request (--url)")
    add_model_flags(p, "tokenizer directory (default: the model's; with --url, the one that "
                       "chunks the document)")
    p.set_defaults(func=_run)
    startup.add_flags(p)


def _run(args) -> None:
    """One rollout of the agent on one row through the rollout contract (rollout/rollouts.py),
    on the local engine or the --url server: MemAgent, its settings from the document flags
    and its row the document read into chunks, or --agent's agent on a row of --question (and
    --doc as its context). Prints the answer (or --json: the record)."""
    import json

    from memagent_jax.console import progress_bar
    from memagent_jax.engine.sampling import SamplingParams

    given = [flag for flag, value in (("--dtype", args.dtype), ("--attention", args.attention),
                                      ("--lora", args.lora)) if value is not None]
    if args.url and given:
        raise UserError(f"{' and '.join(given)}: the --url server runs the model; the "
                        "local engine's settings do not apply to it")
    check_sampling(args.temperature, args.top_p)
    if args.show_tokens and (args.url or args.json):
        raise UserError("--show-tokens prints the local engine's ids: not with --url (a "
                        "server returns text) nor --json" if args.url else
                        "--show-tokens and --json: one of them (both print on stdout)")
    if not 0 < args.timeout < math.inf:
        raise UserError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    agent, document = _memagent(args) if args.agent is None else _other_agent(args)
    model = None if args.url else model_section(args)
    tokenizer = _tokenizer(args, model)
    if args.agent is None:
        row = _interruptible(_checked_sample, tokenizer, args.question, document, args.doc,
                             agent.config)
        calls = len(row.chunks) + 1
    else:
        row, calls = _example(args.question, document), None
    rollouts = _rollouts(args, agent, model, tokenizer, row)
    # A bar where the calls are known (MemAgent: a chunk each, then the answer).
    with progress_bar(total=calls, desc="calls", unit="call",
                      disable=calls is None or not collectives.is_main()) as bar:
        (trajectory,), = rollouts.run(agent, [row], SamplingParams(
            args.temperature, args.top_p, seed=args.seed), on_call=lambda _: bar.update(1))
    if args.verbose:
        _show_turns(trajectory.turns)
    if args.show_tokens:
        from memagent_jax.rl.trained import show_tokens

        print_once(show_tokens(trajectory, tokenizer))
    record = trajectory.record()
    if args.json:  # one JSON document on stdout, the answer in it
        print_once(json.dumps(record, ensure_ascii=False, indent=2))
    else:
        # Stripped: a word-level tokenizer decodes with a space before every word.
        answer = record["answer"]
        print_once((answer if answer is not None else record["final_reply"]).strip())


def _memagent(args):
    """(MemAgent with the document flags' budgets over the model's memagent.json, the --doc
    text)."""
    from memagent_jax.agents.memagent.agent import MemAgent
    from memagent_jax.agents.memagent.config import MemAgentConfig

    if args.doc is None:
        raise UserError("--doc is required (MemAgent reads a document; another agent: --agent)")
    if args.max_len is not None:
        raise UserError("--max-len is --agent's (MemAgent sizes its engine from its budgets)")
    config = from_flags(MemAgentConfig.from_model, model_path=_model_dir(args),
                        chunk_tokens=args.chunk_tokens, max_memory_tokens=args.max_memory_tokens,
                        max_final_tokens=args.max_final_tokens, thinking=args.thinking)
    return MemAgent(config), _read_document(args.doc)


def _other_agent(args):
    """(`run --agent`'s agent, the --doc text or "")."""
    import yaml

    from memagent_jax.errors import ConfigError
    from memagent_jax.rollout.agent_api import load_agent
    from memagent_jax.runconfig import load_yaml

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
    return agent, _read_document(args.doc) if args.doc else ""


def _model_dir(args) -> str:
    """The directory of the model's side files: --model's; with --url, where --model names the
    served model, the tokenizer's (the model's, as a rule), which holds the budgets it was
    trained with (memagent.json) as the model's does."""
    from memagent_jax.model_dir import resolve

    return resolve(os.path.expanduser((args.tokenizer or args.model) if args.url else args.model))


def _tokenizer(args, model):
    """The local model's tokenizer; with --url, `_model_dir`'s (None where it has none: MemAgent
    needs one, to chunk the document)."""
    from memagent_jax.tokenizer import load_tokenizer

    if model is not None:
        return from_flags(model.load_tokenizer, required=True)
    directory = _model_dir(args)
    tokenizer = load_tokenizer(directory) if os.path.isdir(directory) else None
    if tokenizer is None and args.agent is None:
        raise UserError(f"{directory}: no tokenizer files (tokenizer.json) to chunk the "
                        "document with; pass --tokenizer DIR")
    return tokenizer


def _example(question: str, context: str):
    """`run --agent`'s row: the question as its prompt, the document as its context."""
    from memagent_jax.data.pipeline import Example

    prompt = ({"role": "user", "content": question},)
    return Example(0, "", question, context, (), prompt=prompt,
                   fields={"prompt": list(prompt), "context": context})


def _rollouts(args, agent, model, tokenizer, row):
    """Where the rollout runs: the --url server, or an engine on this job's devices sized for
    `row` (a short document under a large chunk budget needs no larger cache)."""
    if args.url:  # --model the served model's name; the sampling is the run's
        from memagent_jax.rollout.client import Server, ServerRollouts, api_key_from_env

        if tokenizer is not None and hasattr(agent, "setup"):
            agent.setup(tokenizer, ())
        return ServerRollouts(Server(args.url, args.model, api_key_from_env(), args.timeout))
    from memagent_jax.engine.engine_api import EngineConfig
    from memagent_jax.engine.factory import load_model_section
    from memagent_jax.models.sharding import job_mesh
    from memagent_jax.rollout.runner import build_runner

    start(args)
    mesh = job_mesh(None)
    loaded = from_flags(load_model_section, section=model, tokenizer=tokenizer, mesh=mesh)
    runner = from_flags(build_runner, agent=agent, model=loaded.model, tokenizer=tokenizer,
                        engine=EngineConfig(slots=1, max_len=args.max_len), mesh=mesh,
                        stop_ids=loaded.stop_ids, row=row)
    return runner.with_params(loaded.params)


def _show_turns(turns) -> None:
    """`--verbose`: every turn (conversation) on stderr, its reply or, where it holds more,
    its messages."""
    for k, turn in enumerate(turns, 1):
        said = ([f"[{m['role']}] {m['content']}" for m in turn.messages]
                if turn.messages and len(turn.messages) > 1 else [turn.reply])
        print(f"--- {turn.kind} turn {k}/{len(turns)}:", *said, sep="\n", file=sys.stderr)


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
        except BaseException as e:  # raised again on the caller's thread
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
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (invalid byte at offset {e.start})") from None
    if not text.strip():
        raise UserError(f"{path}: the document is empty")
    return text
