"""`memagent-jax eval | eval-compare`: the memory agent (or the full-context baseline) over
context lengths; two models' results on the same documents, paired.

Standard library only at import (the CLI builds its parser from this module): JAX and the
runner load inside the command.
"""

from __future__ import annotations

from memagent_jax.commandline import add_command, add_config_flags, start
from memagent_jax.distributed import startup  # stdlib-only at import
from memagent_jax.errors import UserError
from memagent_jax.fileutil import check_output_file


def add_parsers(sub) -> None:
    """Registers `eval` and `eval-compare` on the CLI's subparsers."""
    p = add_command(sub, "eval", help="evaluate the memory agent (or the full-context "
                                      "baseline) over context lengths; an interrupted eval "
                                      "resumes")
    add_config_flags(p, "configs/eval/ruler_hqa_memagent_14b.yaml",
                     "sampling.n=4 data.max_samples=16")
    p.set_defaults(func=_eval)
    startup.add_flags(p)

    p = add_command(sub, "eval-compare", help="two evals of the same documents, paired: each "
                                              "model's count right with its Wilson 95 %% "
                                              "interval, the documents only one gets right, "
                                              "the exact sign test (one dir: counts alone)")
    p.add_argument("dirs", nargs="+", metavar="OUTPUT_DIR",
                   help="one or two finished eval output directories (A, then B)")
    p.add_argument("--metric", choices=("em", "sub_em"), default="em",
                   help="the headline metric; the other is shown beside it")
    p.add_argument("--out", metavar="FILE", help="also write the Markdown table to this new file")
    p.set_defaults(func=_compare)


def _eval(args) -> None:
    from memagent_jax.eval.runner import main as eval_main
    start(args)
    eval_main(args.config, args.overrides)


def _compare(args) -> None:
    if len(args.dirs) > 2:
        raise UserError(f"eval-compare takes one or two output directories, got "
                        f"{len(args.dirs)}")
    if args.out:
        check_output_file(args.out)
    from memagent_jax.eval.compare import main as compare_main
    print(compare_main(args.dirs, args.metric, args.out), end="")
