"""What the packages' command modules (`<package>/command.py`) share: how a subcommand is
declared, the flags several take, how a command joins its job, and how flags' errors and
results are reported.

Standard library only at import, like every command module: `cli.py` imports them all to build
its parser, and `memagent-jax --help` or `memagent-jax data ...` must start without JAX.
"""

from __future__ import annotations

import argparse
import dataclasses
import math

from memagent_jax.distributed import collectives, startup  # stdlib-only at import
from memagent_jax.distributed.preemption import PreemptionNotice
from memagent_jax.errors import ConfigError, Interrupted, UserError


class _HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows every option's default (those that have one)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def add_command(sub, name: str, **kwargs) -> argparse.ArgumentParser:
    """Registers subcommand `name` on `sub` (an `add_subparsers()` result); its --help shows
    every option's default."""
    return sub.add_parser(name, formatter_class=_HelpWithDefaults, **kwargs)


def add_model_flags(p: argparse.ArgumentParser,
                    tokenizer_help: str = "tokenizer directory (default: the model's)") -> None:
    """The `model` section's flags besides --model (see engine.factory.ModelSection; a
    command builds the section with engine.command.model_section)."""
    p.add_argument("--tokenizer", metavar="DIR", help=tokenizer_help)
    p.add_argument("--dtype", choices=("float32", "bfloat16"),
                   help="the weights' and compute dtype (default: float32 on CPU, bfloat16 "
                        "on GPU/TPU)")
    p.add_argument("--attention",
                   help="how prompts attend: xla (the default), dot_product, cudnn (GPU), "
                        "splash (TPU)")
    p.add_argument("--lora", metavar="ADAPTER_DIR",
                   help="a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors) "
                        "merged onto the model's weights")



_TOKEN_SUFFIXES = {"K": 1024, "M": 1024 ** 2}


def tokens(text: str) -> int:
    """argparse type of every flag that takes a number of tokens: "8192", "8K" (K = 1024, as
    the eval's columns and RULER's lengths count), "1M", "1.5K"."""
    try:
        return int(text)
    except ValueError:
        pass
    scale = _TOKEN_SUFFIXES.get(text[-1:].upper())
    try:
        count = float(text[:-1]) * scale if scale else math.nan
    except ValueError:
        count = math.nan
    if not math.isfinite(count) or count != int(count):
        raise argparse.ArgumentTypeError(f"expected a number of tokens such as 8192, 8K or 1M "
                                         f"(K = 1024), got {text!r}")
    return int(count)


def seed(text: str) -> int:
    """argparse type of every --seed flag: an integer >= 0 (NumPy's generators refuse a
    negative seed, where JAX's keys and Python's would take it silently)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a seed, an integer >= 0, got {text!r}")
    return value


def add_config_flags(p: argparse.ArgumentParser, example: str, overrides: str) -> None:
    """A YAML config and its dotted `key=value` overrides (`train`, `eval`); `example` and
    `overrides` are the help's examples."""
    p.add_argument("--config", required=True, metavar="YAML", help=f"e.g. {example}")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help=f"dotted overrides, e.g. {overrides}")


def start(args, auto: bool = False) -> None:
    """Joins this process to its multi-process job, if it is one (`distributed.startup`);
    every process must run the same command line, bar the start-up flags."""
    launch = startup.launch_from_flags(args, auto)
    skip = {"func", *(f.name for f in dataclasses.fields(launch)), "local_device_ids",
            "start_timeout", "distributed"}
    fingerprint = repr(sorted((k, v) for k, v in vars(args).items() if k not in skip))
    startup.start(launch, fingerprint)


def stop_when_signalled(notice: PreemptionNotice, kept=None):
    """A poll for long work under `notice` (SIGINT and SIGTERM only set its flag, so neither
    is lost, as a KeyboardInterrupt is when it lands in a garbage-collection callback, nor
    cuts a file's write short, nor leaves Orbax's background reads and writes to fail
    against a closed event loop): raises Interrupted once a signal came, saying what `kept()`
    returns (what was written, if anything). The CLI exits with status 130 (Ctrl-C) or 143
    (SIGTERM)."""
    def poll() -> None:
        if notice.reached():
            cause = "interrupted (Ctrl-C)" if notice.interrupted else "stopped (SIGTERM)"
            said = kept() if kept else ""
            raise Interrupted(f"{cause}; {said}" if said else cause, notice.signal_number)
    return poll


def from_flags(build, **flags):
    """build(**flags) (a config section, or a section's method), its ConfigErrors named by the
    command's flags: engine.max_len -> --max-len, model.path -> --model."""
    try:
        return build(**flags)
    except ConfigError as e:
        name = e.key.rsplit(".", 1)[-1]
        flag = "--model" if name == "path" else "--" + name.replace("_", "-")
        raise UserError(f"{flag} {e.message}") from None


def print_once(line: str) -> None:
    """A result line on stdout, from process 0 only (every process of a job computes it)."""
    if collectives.is_main():
        print(line)
