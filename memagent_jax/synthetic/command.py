"""`memagent-jax demo | trace | data synthetic`: the synthetic experiment's commands.

The core packages import nothing from here; `cli.py` registers these beside theirs, `data
synthetic` in the `data` group (`add_data_parsers`). Standard library only at import (the CLI
builds its parser from this module): JAX, the model and the tokenizer load inside each command.
"""

from __future__ import annotations

import argparse
import os

from memagent_jax.commandline import add_command, seed, start, stop_when_signalled, tokens
from memagent_jax.distributed import startup  # stdlib-only at import
from memagent_jax.distributed.preemption import PreemptionNotice
from memagent_jax.errors import UserError

# Bytes of memory a token of the longest document takes at the peak of `data synthetic`
# (measured: maximum RSS against length, 4M to 16M tokens): building an eval set's document
# (17), or one that --fact-at-chunk-end moves a fact in (89: it splits the document into
# words); every row of --layout train, all kept until the parquet file is written (42).
BUILD_BYTES_PER_TOKEN = 18
CHUNK_END_BYTES_PER_TOKEN = 90
TRAIN_ROW_BYTES_PER_TOKEN = 45


def add_parsers(sub) -> None:
    """Registers `demo` and `trace` on the CLI's subparsers."""
    p = add_command(sub, "demo", help="the shipped memory agent reads a fresh synthetic "
                                      "document of any length and answers")
    p.add_argument("--model", default="memagent-tiny", metavar="NAME_OR_PATH",
                   help="a model trained on the synthetic tasks (docs/synthetic.md): a "
                        "directory or a shipped model's name")
    p.add_argument("--length", type=tokens, default=300_000,
                   help="document tokens: 300000, 8K, 1M, ... (K = 1024; at least one chunk)")
    p.add_argument("--task", default="multikey", help="multikey or twohop")
    p.add_argument("--seed", type=seed, help="the document's seed (default: a random one)")
    p.add_argument("--show", type=int, default=6, help="memory changes to print")
    _add_budget_flags(p)
    p.set_defaults(func=_demo)
    startup.add_flags(p)

    p = add_command(sub, "trace", help="where the memory goes wrong: a memory agent reads "
                                       "fresh synthetic documents, and each needed fact is "
                                       "followed turn by turn")
    p.add_argument("--model", default="memagent-tiny", metavar="NAME_OR_PATH",
                   help="a model trained on the synthetic tasks: a directory or a shipped "
                        "model's name")
    p.add_argument("--length", type=tokens, default=8192,
                   help="document tokens: 8192, 8K, 1M, ... (K = 1024)")
    p.add_argument("--task", default="multikey", help="multikey or twohop")
    p.add_argument("--num-samples", type=int, default=32, help="documents read")
    p.add_argument("--seed", type=seed, default=777,
                   help="the documents' seed (the recipe's data: seeds 1-5; its evaluation: 9)")
    p.add_argument("--slots", type=int, default=16, help="documents read together")
    p.add_argument("--out", metavar="FILE.jsonl",
                   help="also write the traces, one a line, to this new file")
    p.add_argument("--carries", action="store_true",
                   help="instead of reading: score every turn that should keep the memory as "
                        "it is, teacher-forced, and count those the model would rewrite "
                        "(one process)")
    p.add_argument("--selection", action="store_true",
                   help="instead of following the needed facts: count the memories the answer "
                        "is read from that hold the asked fact and those that hold each "
                        "distractor (Wilson 95 %% intervals, an exact test of the asked "
                        "facts held against chance); --out gets a record a document")
    _add_budget_flags(p)
    p.set_defaults(func=_trace)
    startup.add_flags(p)


def add_data_parsers(kinds) -> None:
    """Registers `data synthetic` on the `data` group's subparsers (`data.command.add_parsers`
    returns them)."""
    p = kinds.add_parser("synthetic", help="synthetic long-document tasks over a made-up "
                                           "vocabulary (multikey, twohop), lengths exact in "
                                           "the tokenizer written beside them",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--task", required=True, help="multikey or twohop")
    p.add_argument("--lengths", type=tokens, nargs="+", required=True, metavar="TOKENS",
                   help="document lengths in tokens, e.g. 1024 8K 1M (K = 1024)")
    p.add_argument("--num-samples", type=int, default=64, help="samples per length")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--layout", choices=("eval", "train"), default="eval",
                   help="eval: eval_TASK_LENGTH.json per length (what `memagent-jax eval` "
                        "reads); train: train_TASK.parquet with every length (what `train` "
                        "reads)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="also gets tokenizer/, the word-level tokenizer of the vocabulary")
    p.add_argument("--fact-at-chunk-end", type=int, metavar="TOKENS",
                   help="move the last fact the answer needs so that it ends in the last "
                        "TOKENS tokens of a chunk, not the first (documents where the recipe's "
                        "models often miss it)")
    p.add_argument("--chunk-tokens", type=tokens, default=256,
                   help="the chunk size --fact-at-chunk-end places by (the reader's)")
    p.set_defaults(func=_synthetic)


def _add_budget_flags(p: argparse.ArgumentParser) -> None:
    """The memory loop's budgets, each the model's own (its memagent.json) unless given."""
    p.add_argument("--chunk-tokens", type=tokens, help="default: the model's (memagent.json)")
    p.add_argument("--max-memory-tokens", type=tokens, help="default: the model's")
    p.add_argument("--max-final-tokens", type=tokens, help="default: the model's")


def _budgets(args) -> dict:
    return {"chunk_tokens": args.chunk_tokens, "max_memory_tokens": args.max_memory_tokens,
            "max_final_tokens": args.max_final_tokens}


def _demo(args) -> None:
    """The demo, then a line for each needed fact whose key the memory held a value for before
    the fact was read (trace.made_up_lines)."""
    from memagent_jax.synthetic.demo import run_demo
    from memagent_jax.synthetic.trace import made_up_lines
    if args.show < 0:
        raise UserError(f"--show must be 0 or more (memory changes to print), got {args.show}")
    start(args)
    with PreemptionNotice() as notice:
        read = run_demo(args.model, args.task, args.length, args.seed, args.show,
                        _budgets(args), stop_when_signalled(notice))
    for line in made_up_lines(read):
        print(line)


def _trace(args) -> None:
    if args.carries and args.selection:
        raise UserError("--carries and --selection are two other uses of trace: give one")
    if args.selection:
        from memagent_jax.synthetic.selection import run_selection
        start(args)
        run_selection(args.model, args.task, args.length, args.seed, args.num_samples,
                      _budgets(args), args.slots, args.out)
        return
    if args.carries:
        from memagent_jax.synthetic.carries import run_carries
        if args.out:
            raise UserError("--out: trace --carries prints its scores and writes no file")
        run_carries(args.model, args.task, args.length, args.seed, args.num_samples,
                    _budgets(args))
        return
    from memagent_jax.synthetic.trace import run_trace
    start(args)
    run_trace(args.model, args.task, args.length, args.seed, args.num_samples, _budgets(args),
              args.slots, args.out)


def _synthetic(args) -> None:
    from memagent_jax.console import progress_bar
    from memagent_jax.data.io import write_parquet, write_set
    from memagent_jax.data.needle import write_tokenizer
    from memagent_jax.fileutil import check_new_files, check_output_dir
    from memagent_jax.synthetic import tasks as synthetic
    synthetic.check_task(args.task)
    shortest = synthetic.min_length(args.task)
    for length in args.lengths:
        if length < shortest:
            raise UserError(f"--lengths {length}: a {args.task} document needs at least "
                            f"{shortest} tokens")
    if args.fact_at_chunk_end is not None:
        for length in args.lengths:
            synthetic.check_chunk_end(length, args.chunk_tokens, args.fact_at_chunk_end)
    if args.num_samples <= 0:
        raise UserError(f"--num-samples must be positive, got {args.num_samples}")
    _check_memory(args)
    check_output_dir(args.out, "--out")
    train_path = os.path.join(args.out, f"train_{args.task}.parquet")
    eval_paths = {n: os.path.join(args.out, f"eval_{args.task}_{n}.json") for n in args.lengths}
    check_new_files([train_path] if args.layout == "train" else list(eval_paths.values()),
                    "--out")
    tokenizer = os.path.join(args.out, "tokenizer")
    current = train_path  # the file being written
    written: list[str] = []  # those complete

    def kept() -> str:
        return f"{current} was not written" + (f" ({', '.join(written)} complete)"
                                               if written else "")

    def samples(length, make):
        for i in progress_bar(range(args.num_samples), desc=f"{args.task} {length}",
                              unit="sample"):
            poll()
            made = synthetic.make_sample(args.task, length, args.seed, i, poll)
            if args.fact_at_chunk_end is not None:
                made = synthetic.fact_at_chunk_end(made, args.chunk_tokens,
                                                   args.fact_at_chunk_end, args.seed, i)
            yield make(made, args.task, length, i)

    # Ctrl-C and SIGTERM stop the work at the next poll (every sample, and every
    # POLL_TOKENS of a document), where the file being written is removed unwritten.
    with PreemptionNotice() as notice:
        poll = stop_when_signalled(notice, kept)
        if not os.path.isdir(tokenizer):
            write_tokenizer(tokenizer, synthetic.vocabulary())
        if args.layout == "train":
            rows = [row for length in args.lengths
                    for row in samples(length, synthetic.train_row)]
            write_parquet(train_path, rows)
            print(f"wrote {len(rows)} {args.task} training samples to {train_path}")
            return
        for length, current in eval_paths.items():
            count = write_set(current, samples(length, synthetic.eval_record))
            written.append(current)
            print(f"wrote {count} {args.task} samples of {length} tokens to {current}")


def _check_memory(args) -> None:
    """Refuses --lengths whose documents (with --layout train, whose rows) need more memory
    than the machine has available (the figures of BUILD_BYTES_PER_TOKEN's comment)."""
    from memagent_jax.synthetic import tasks as synthetic
    longest = max(args.lengths)
    per_token = (BUILD_BYTES_PER_TOKEN if args.fact_at_chunk_end is None
                 else CHUNK_END_BYTES_PER_TOKEN)
    needed = per_token * longest
    what = (f"--lengths {longest}: a document of {longest:,} tokens takes about {per_token} "
            "bytes a token to build")
    if args.layout == "train":
        total = args.num_samples * sum(args.lengths)
        needed += TRAIN_ROW_BYTES_PER_TOKEN * total
        what = (f"--lengths {' '.join(map(str, args.lengths))} with --num-samples "
                f"{args.num_samples}: --layout train keeps every row ({total:,} tokens, about "
                f"{TRAIN_ROW_BYTES_PER_TOKEN} bytes a token) until the parquet file is written")
    synthetic.check_memory(what, needed)
