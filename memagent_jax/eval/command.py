"""`memagent-jax eval`: the memory agent (or the full-context baseline) over context lengths.

Standard library only at import (the CLI builds its parser from this module): JAX and the
runner load inside the command.
"""

from __future__ import annotations

from memagent_jax import distributed  # stdlib-only at import
from memagent_jax.commandline import add_command, add_config_flags, start


def add_parsers(sub) -> None:
    """Registers `eval` on the CLI's subparsers."""
    p = add_command(sub, "eval", help="evaluate the memory agent (or the full-context "
                                      "baseline) over context lengths; an interrupted eval "
                                      "resumes")
    add_config_flags(p, "configs/eval/ruler_hqa_memagent_14b.yaml",
                     "sampling.n=4 data.max_samples=16")
    p.set_defaults(func=_eval)
    distributed.add_flags(p)


def _eval(args) -> None:
    from memagent_jax.eval.runner import main as eval_main
    start(args)
    eval_main(args.config, args.overrides)
