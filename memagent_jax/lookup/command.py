"""`memagent-jax data lookup`: the lookup task's rows (task.py). Standard library only at
import."""

from __future__ import annotations

import argparse

from memagent_jax.commandline import seed
from memagent_jax.errors import UserError


def add_data_parsers(kinds) -> None:
    """Registers `data lookup` on the `data` group's subparsers."""
    p = kinds.add_parser("lookup", help="rows whose answer a lookup(key) tool call gives (the "
                                        "tool-calling experiment), and their tokenizer",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--num-samples", type=int, default=64, help="rows")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--layout", choices=("eval", "train"), default="eval",
                   help="eval: eval_lookup.json (what `eval` reads); train: train.parquet "
                        "(what `train` reads)")
    p.add_argument("--out", required=True, metavar="DIR", help="also gets tokenizer/")
    p.set_defaults(func=_lookup)


def _lookup(args) -> None:
    from memagent_jax.fileutil import check_new_files, check_output_dir
    from memagent_jax.lookup.task import output_path, write_task

    if args.num_samples <= 0:
        raise UserError(f"--num-samples must be positive, got {args.num_samples}")
    check_output_dir(args.out, "--out")
    check_new_files([output_path(args.out, args.layout)], "--out")
    path = write_task(args.out, args.seed, args.num_samples, args.layout)
    print(f"wrote {args.num_samples} rows (seed {args.seed}) to {path}")
