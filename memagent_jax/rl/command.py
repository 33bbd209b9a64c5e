"""`memagent-jax train | curves`: train the memory agent; draw training runs' curves.

Standard library only at import (the CLI builds its parser from this module): JAX and the
trainer load inside `train`, after its config has been checked.
"""

from __future__ import annotations

from memagent_jax.commandline import add_command, add_config_flags, start
from memagent_jax.distributed import startup  # stdlib-only at import
from memagent_jax.errors import UserError
from memagent_jax.fileutil import check_output_file
from memagent_jax.rl.curves import DEFAULT_TAGS  # stdlib-only at import


def add_parsers(sub) -> None:
    """Registers `train` and `curves` on the CLI's subparsers."""
    p = add_command(sub, "train", help="train the memory agent with multi-conversation DAPO "
                                       "(resumes from the newest checkpoint in the run's "
                                       "output)")
    add_config_flags(p, "configs/train/tiny_cpu.yaml", "learner.lr=1e-6 steps=10")
    p.set_defaults(func=_train)
    startup.add_flags(p)

    p = add_command(sub, "curves", help="training curves of runs (their TensorBoard scalars), "
                                        "one after another or overlaid, as a PNG")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="training output directories")
    p.add_argument("--out", required=True, metavar="PNG",
                   help="a new picture file: .png, or another format matplotlib writes "
                        "(.pdf, .svg, ...)")
    p.add_argument("--tags", nargs="+", default=list(DEFAULT_TAGS), help="scalars to draw")
    p.add_argument("--names", nargs="+", help="the runs' legend names (default: directories)")
    p.add_argument("--overlay", action="store_true",
                   help="draw the runs over each other, each from step 0 (runs that start from "
                        "one checkpoint, e.g. the arms of an ablation), not one after another")
    p.set_defaults(func=_curves)


def _train(args) -> None:
    from memagent_jax.rl.config import load_train_config
    config = load_train_config(args.config, args.overrides)  # plain data, every key checked
    start(args, auto=config.distributed)
    from memagent_jax.rl.trainer import train
    train(config)


def _curves(args) -> None:
    from memagent_jax.rl.curves import plot_curves
    check_output_file(args.out)
    if args.names and len(args.names) != len(args.runs):
        raise UserError(f"--names: {len(args.names)} names for {len(args.runs)} runs")
    plot_curves(args.runs, args.out, tuple(args.tags), args.names, args.overlay)
    print(f"wrote {args.out}")
