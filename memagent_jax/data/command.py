"""`memagent-jax data ...`: build RULER-HQA evaluation sets, HotpotQA training sets and RULER
synthetic sets. Every input is checked before the first file is written; each set file is
written whole (temporary file renamed into place) or not at all.

This module imports only the standard library at import time: the CLI builds its parser
without pulling in `datasets` or a tokenizer.
"""

from __future__ import annotations

import argparse
import os

from memagent_jax.commandline import seed, tokens  # stdlib-only at import
from memagent_jax.console import progress_bar  # stdlib-only at import


def add_parsers(sub):
    """Registers `data` and its subcommands on the CLI's subparsers; returns the `data` group's
    subparsers, where other packages register theirs (`data synthetic`, `data lookup`)."""
    # Every kind, the experiments' too (tests/core/test_commandline.py checks it)
    data = sub.add_parser("data", help="build evaluation and training sets: ruler-hqa, "
                                       "hotpotqa-train, ruler, needle, synthetic, lookup")
    kinds = data.add_subparsers(dest="data_command", required=True)

    p = kinds.add_parser("ruler-hqa", help="RULER-HQA evaluation sets from HotpotQA dev "
                                           "(one file eval_N.json per documents-per-sample N)")
    _source_arguments(p, default_split="validation")
    p.add_argument("--num-docs", type=int, nargs="+", required=True, metavar="N",
                   help="documents per sample, e.g. 50 100 200 (50 is ~7K tokens)")
    p.add_argument("--num-samples", type=int, default=128, help="questions per set (128)")
    p.add_argument("--indices-from", metavar="FILE",
                   help="take the questions' row indices from this set's 'index' (or "
                        "extra_info.index) field, e.g. the published hotpotqa_dev.parquet")
    p.add_argument("--out", required=True, metavar="DIR")
    p.set_defaults(func=_ruler_hqa)

    p = kinds.add_parser("hotpotqa-train", help="a MemAgent training set (parquet, the layout "
                                                "of BytedTsinghua-SIA/hotpotqa)")
    _source_arguments(p, default_split="train")
    p.add_argument("--num-docs", type=int, default=200, help="documents per sample (200)")
    p.add_argument("--num-samples", type=int, default=None, help="default: every question")
    p.add_argument("--data-source", default="hotpotqa", help="the rows' data_source field")
    p.add_argument("--out", required=True, metavar="FILE.parquet")
    p.set_defaults(func=_hotpotqa_train)

    p = kinds.add_parser("ruler", help="RULER synthetic sets (one file eval_TASK_LENGTH.json)")
    p.add_argument("--tasks", nargs="+", required=True,
                   help="niah_single_1/2/3, niah_multikey_1/2/3, niah_multivalue, "
                        "niah_multiquery, vt, fwe")
    p.add_argument("--lengths", type=tokens, nargs="+", required=True, metavar="TOKENS",
                   help="context lengths in the tokenizer's tokens, e.g. 8192 16K (K = 1024)")
    p.add_argument("--tokenizer", required=True, metavar="DIR",
                   help="model or tokenizer directory whose tokens measure the length")
    p.add_argument("--num-samples", type=int, default=128)
    p.add_argument("--haystack", metavar="FILE",
                   help="essay text for the essay-haystack tasks (RULER: Paul Graham's essays)")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--out", required=True, metavar="DIR")
    p.set_defaults(func=_ruler)

    p = kinds.add_parser("needle", help="the synthetic needle task for CPU smoke runs "
                                        "(train.parquet, val.parquet, tokenizer/; "
                                        "configs/train/tiny_cpu.yaml trains on it)",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--train-size", type=int, default=64, help="training questions")
    p.add_argument("--val-size", type=int, default=16, help="validation questions")
    p.add_argument("--seed", type=seed, default=0, help="the documents' random seed")
    p.set_defaults(func=_needle)

    return kinds


def _needle(args) -> None:
    from memagent_jax.data.needle import write_task
    from memagent_jax.fileutil import check_new_output
    check_new_output(args.out, "--out")
    paths = write_task(args.out, args.train_size, args.val_size, args.seed)
    print("\n".join(f"{name}: {path}" for name, path in paths.items()))


def _source_arguments(p: argparse.ArgumentParser, default_split: str) -> None:
    p.add_argument("--source", required=True,
                   help="HotpotQA: a hub id (hotpotqa/hotpot_qa) or local .json/.jsonl/.parquet "
                        "files (comma-separated), e.g. hotpot_dev_distractor_v1.json")
    p.add_argument("--split", default=None, help=f"hub split (default {default_split})")
    p.add_argument("--name", default=None, help="hub configuration (default distractor)")
    p.add_argument("--seed", type=seed, default=None,
                   help="draws of the other documents (default 42, as the original)")
    p.add_argument("--shuffle-seed", type=int, default=None,
                   help="document order (default 4, as the original)")
    p.set_defaults(default_split=default_split)


def _corpus(args):
    from memagent_jax.data.hotpotqa import read_corpus
    from memagent_jax.data.io import load_source
    dataset = load_source(args.source, args.split, args.name, default_name="distractor",
                          default_split=args.default_split)
    return read_corpus(dataset, args.source)


def _seeds(args) -> dict:
    from memagent_jax.data.hotpotqa import DEFAULT_SEED, DEFAULT_SHUFFLE_SEED
    return {"seed": DEFAULT_SEED if args.seed is None else args.seed,
            "shuffle_seed": DEFAULT_SHUFFLE_SEED if args.shuffle_seed is None
            else args.shuffle_seed}


def _indices_from(path: str) -> list[int]:
    from memagent_jax.data.io import load_source
    from memagent_jax.errors import UserError
    dataset = load_source(path)
    if "index" in dataset.column_names:
        values = dataset["index"]
    elif "extra_info" in dataset.column_names:
        values = [row and row.get("index") for row in dataset["extra_info"]]
    else:
        raise UserError(f"{path}: no 'index' or 'extra_info.index' field to take indices from")
    if not all(isinstance(v, int) for v in values):
        raise UserError(f"{path}: every 'index' must be an integer")
    return list(values)


def _ruler_hqa(args) -> None:
    from memagent_jax.data.hotpotqa import check_num_docs, ruler_hqa_records, select_questions
    from memagent_jax.data.io import write_set
    from memagent_jax.fileutil import check_new_files, check_output_dir
    check_output_dir(args.out, "--out")
    check_new_files([os.path.join(args.out, f"eval_{n}.json") for n in args.num_docs], "--out")
    corpus = _corpus(args)
    indices = _indices_from(args.indices_from) if args.indices_from else None
    questions = select_questions(corpus, args.num_samples, indices)
    for n in args.num_docs:  # every length checked before the first file is written
        check_num_docs(corpus, n, questions)
    for n in args.num_docs:
        path = os.path.join(args.out, f"eval_{n}.json")
        records = ruler_hqa_records(corpus, n, questions, **_seeds(args))
        count = write_set(path, progress_bar(records, total=len(questions),
                                             desc=f"{n} docs", unit="sample"))
        print(f"wrote {count} samples with {n} documents each to {path}")


def _hotpotqa_train(args) -> None:
    from memagent_jax.data.hotpotqa import select_questions, training_rows
    from memagent_jax.data.io import write_parquet
    from memagent_jax.fileutil import check_output_file
    check_output_file(args.out)
    corpus = _corpus(args)
    questions = select_questions(corpus, args.num_samples)
    rows = list(progress_bar(training_rows(corpus, args.num_docs, questions, **_seeds(args),
                                           data_source=args.data_source),
                             total=len(questions), desc="train", unit="sample"))
    write_parquet(args.out, rows)
    print(f"wrote {len(rows)} training samples with {args.num_docs} documents each to "
          f"{args.out}")


def _ruler(args) -> None:
    from memagent_jax.data.io import write_set
    from memagent_jax.data.ruler import check_task, needs_essay, ruler_records
    from memagent_jax.errors import UserError
    from memagent_jax.fileutil import check_new_files, check_output_dir
    from memagent_jax.tokenizer import load_tokenizer
    for task in args.tasks:
        check_task(task)
    if any(length <= 0 for length in args.lengths) or args.num_samples <= 0:
        raise UserError("--lengths and --num-samples must be positive")
    haystack = None
    if args.haystack:
        if not os.path.isfile(args.haystack):
            raise UserError(f"{args.haystack}: not found")
        with open(args.haystack, encoding="utf-8") as f:
            haystack = f.read()
    elif any(needs_essay(t) for t in args.tasks):
        essay = ", ".join(t for t in args.tasks if needs_essay(t))
        raise UserError(f"tasks {essay} need an essay haystack: pass --haystack FILE (RULER "
                        "uses Paul Graham's essays)")
    check_output_dir(args.out, "--out")
    check_new_files([os.path.join(args.out, f"eval_{task}_{length}.json")
                     for task in args.tasks for length in args.lengths], "--out")
    tokenizer = load_tokenizer(args.tokenizer) if os.path.isdir(args.tokenizer) else None
    if tokenizer is None:
        raise UserError(f"{args.tokenizer}: no tokenizer files (tokenizer.json) to measure "
                        "lengths with")
    for task in args.tasks:
        for length in args.lengths:
            path = os.path.join(args.out, f"eval_{task}_{length}.json")
            records = ruler_records(task, length, args.num_samples, tokenizer, args.seed,
                                    haystack)
            count = write_set(path, progress_bar(records, total=args.num_samples,
                                                 desc=f"{task} {length}", unit="sample"))
            print(f"wrote {count} {task} samples of {length} tokens to {path}")
