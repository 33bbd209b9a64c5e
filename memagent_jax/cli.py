"""The `memagent-jax` command: assembles the subcommands each package registers (its
`command.py`) and turns their errors into exit statuses.

Every subcommand validates its input before touching devices; a `UserError` becomes one line on
stderr (`memagent-jax: error: ...`) and exit status 2, and outputs are written all-or-nothing.
Every command module imports only the standard library at import time, so `memagent-jax --help`
and `memagent-jax data ...` start without JAX. The experiments' commands (synthetic's `demo`,
`trace`, `data synthetic`; lookup's `data lookup`) are registered here, the one place outside
their packages that imports them: the core packages import nothing from them.
"""

from __future__ import annotations

import argparse
import os
import sys

import memagent_jax
from memagent_jax.data import command as data_command
from memagent_jax.engine import command as engine_command
from memagent_jax.errors import Interrupted, UserError
from memagent_jax.eval import command as eval_command
from memagent_jax.lookup import command as lookup_command
from memagent_jax.models import command as models_command
from memagent_jax.rl import command as rl_command
from memagent_jax.rollout import command as rollout_command
from memagent_jax.serve import command as serve_command
from memagent_jax.synthetic import command as synthetic_command


class _Version(argparse.Action):
    """--version: the installed distribution's version, looked up only when asked
    (importlib.metadata would add a quarter of the start-up time); from a source tree that is
    not installed, the package's own `__version__`."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib import metadata
        try:
            version = metadata.version("memagent-jax")
        except metadata.PackageNotFoundError:
            version = memagent_jax.__version__
        print(f"{parser.prog} {version}")
        parser.exit()


class _AliasChecked(argparse._StoreAction):
    """argparse's "store", refusing an option given again under another of its names with
    another value: argparse keeps the last one silently, and `generate --out a --output b`
    wrote b alone, the alias hiding that both name one setting. The same name again keeps
    argparse's rule, the last one wins (a script's defaults, then the user's), as does the
    same value under two names."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = vars(namespace).setdefault(_GIVEN, {})
        names, value = given.get(self.dest, (set(), values))  # the names used, the value
        others = sorted(names - {option_string})
        if others and value != values:
            raise argparse.ArgumentError(self, f"given twice with two values ({others[0]} "
                                               f"{value}, then {option_string} {values}): "
                                               "give it once")
        given[self.dest] = names | {option_string}, values
        super().__call__(parser, namespace, values, option_string)


_GIVEN = "_options_given"  # _AliasChecked's record in the namespace while it is parsed


class _Parser(argparse.ArgumentParser):
    """The command line's parser, and its subcommands' (argparse makes them of the parser's
    class): options stored with `_AliasChecked`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", "store", _AliasChecked)
        self.register("action", None, _AliasChecked)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        vars(namespace).pop(_GIVEN, None)
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every package's subcommands, in the order --help lists them."""
    parser = _Parser(
        prog="memagent-jax",
        description="MemAgent on JAX: Qwen2.5 and Qwen3 models, the chunk-memory loop, DAPO "
                    "training.")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True)
    models_command.add_parsers(sub)
    engine_command.add_parsers(sub)
    rollout_command.add_parsers(sub)
    synthetic_command.add_parsers(sub)
    serve_command.add_parsers(sub)
    rl_command.add_parsers(sub)
    eval_command.add_parsers(sub)
    data_kinds = data_command.add_parsers(sub)
    synthetic_command.add_data_parsers(data_kinds)
    lookup_command.add_data_parsers(data_kinds)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one command line; returns its exit status: 0, 2 (a UserError or a refused file
    operation, one line on stderr), 130 (Ctrl-C), 143 (stopped by SIGTERM: a preemption) or
    141 (stdout closed early)."""
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except UserError as e:
        # Notes say where it arose (the agent and row a rollout of which raised it: runner.py).
        where = "; ".join(getattr(e, "__notes__", ()))
        print(f"memagent-jax: error: {e}{f' ({where})' if where else ''}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # stdout's reader stopped early (`| head`): as a shell's SIGPIPE
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
        return 141
    except OSError as e:  # the file system refused (disk full, permissions): one line as well
        where = f"{e.filename}: " if e.filename else ""
        print(f"memagent-jax: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except Interrupted as e:
        print(f"memagent-jax: {e}", file=sys.stderr)
        return e.status
    except KeyboardInterrupt:  # Ctrl-C where no command catches it to say what it kept
        print("memagent-jax: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
