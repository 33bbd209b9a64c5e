"""The `memagent-jax` command.

Every subcommand validates its input before touching devices; a `UserError` becomes one line on
stderr (`memagent-jax: error: ...`) and exit status 2, and outputs are written all-or-nothing.
"""

from __future__ import annotations

import argparse
import sys

from memagent_jax.errors import UserError
from memagent_jax.fileutil import check_new_output


def _convert(args) -> None:
    from memagent_jax.models import load_model, save_checkpoint
    check_new_output(args.out)
    model, config = load_model(args.hf, dtype=None)
    save_checkpoint(model, config, args.out, side_files_dir=args.hf)
    print(f"converted {args.hf} -> {args.out} ({config.num_layers} layers, {config.dtype})")


def _export(args) -> None:
    from memagent_jax.models import load_model, save_hf
    from memagent_jax.models.checkpoint import is_checkpoint_directory, side_files_dir
    max_shard_bytes = _parse_size(args.max_shard_size)
    check_new_output(args.out)
    if not is_checkpoint_directory(args.ckpt):
        raise UserError(f"{args.ckpt}: not a memagent-jax checkpoint (expected model_config.json "
                        "and params/; create one with `memagent-jax convert`)")
    model, config = load_model(args.ckpt, dtype=None)
    save_hf(model, config, args.out, tokenizer_dir=side_files_dir(args.ckpt),
            max_shard_bytes=max_shard_bytes)
    print(f"exported {args.ckpt} -> {args.out}")


def _random_model(args) -> None:
    from memagent_jax.models import preset_config, random_model, save_hf
    max_shard_bytes = _parse_size(args.max_shard_size)
    check_new_output(args.out)
    config = preset_config(args.preset, dtype=args.dtype)
    save_hf(random_model(config, seed=args.seed), config, args.out,
            max_shard_bytes=max_shard_bytes)
    print(f"wrote a random-weight {args.preset} model ({args.dtype}) to {args.out}")


def _parse_size(text: str) -> int:
    units = {"KB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3, "B": 1}
    for unit, scale in units.items():
        if text.upper().endswith(unit):
            number = text[: -len(unit)]
            break
    else:
        number, scale = text, 1
    try:
        size = int(float(number) * scale)
    except (ValueError, OverflowError):  # not a number; inf
        size = 0
    if size <= 0:
        raise UserError(f"--max-shard-size: expected a size such as 5GB or 500MB, got {text!r}")
    return size


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memagent-jax",
        description="MemAgent on JAX: Qwen2.5 models, the chunk-memory loop, DAPO training.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("convert", help="HF safetensors directory -> memagent-jax checkpoint")
    p.add_argument("--hf", required=True, metavar="HF_DIR", help="config.json + *.safetensors")
    p.add_argument("--out", required=True, metavar="CKPT_DIR", help="new checkpoint directory")
    p.set_defaults(func=_convert)

    p = sub.add_parser("export", help="memagent-jax checkpoint -> HF safetensors directory")
    p.add_argument("--ckpt", required=True, metavar="CKPT_DIR")
    p.add_argument("--out", required=True, metavar="HF_DIR", help="new (or empty) directory")
    p.add_argument("--max-shard-size", default="5GB",
                   help="split weights into files of at most this size, with an index (5GB)")
    p.set_defaults(func=_export)

    p = sub.add_parser("random-model",
                       help="write an HF directory with random weights in a Qwen2.5 shape")
    p.add_argument("--preset", default="tiny", help="tiny, qwen2.5-0.5b, ..., qwen2.5-72b")
    p.add_argument("--out", required=True, metavar="HF_DIR")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-shard-size", default="5GB")
    p.set_defaults(func=_random_model)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except UserError as e:
        print(f"memagent-jax: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the file system refused (disk full, permissions): one line as well
        print(f"memagent-jax: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
