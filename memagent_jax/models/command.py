"""`memagent-jax convert | export | random-model | vocab`: model files in, model files out,
and what a model's tokenizer reads.

Standard library only at import (the CLI builds its parser from this module): JAX and the
model code load inside each command.
"""

from __future__ import annotations

import contextlib

from memagent_jax.commandline import add_command, print_once, seed, start, stop_when_signalled
from memagent_jax.distributed import startup  # stdlib-only at import
from memagent_jax.distributed.preemption import PreemptionNotice
from memagent_jax.errors import UserError
from memagent_jax.fileutil import check_new_output


def add_parsers(sub) -> None:
    """Registers `convert`, `export`, `random-model` and `vocab` on the CLI's subparsers."""
    p = add_command(sub, "convert", help="HF safetensors directory -> memagent-jax checkpoint")
    p.add_argument("--model", "--hf", required=True, metavar="HF_DIR",
                   help="config.json + *.safetensors")
    p.add_argument("--out", required=True, metavar="CKPT_DIR", help="new checkpoint directory")
    p.add_argument("--lora", metavar="ADAPTER_DIR",
                   help="a PEFT LoRA adapter merged onto the weights before they are written")
    p.set_defaults(func=_convert)
    startup.add_flags(p)

    p = add_command(sub, "export", help="memagent-jax checkpoint -> HF safetensors directory")
    p.add_argument("--model", "--ckpt", required=True, metavar="CKPT_DIR",
                   help="a `convert` output, a training run's output directory (its newest "
                        "step), checkpoints directory or step directory; or an HF directory "
                        "or a shipped model's name (memagent_jax/pretrained), written again "
                        "(with another --max-shard-size)")
    p.add_argument("--out", required=True, metavar="HF_DIR", help="new (or empty) directory")
    p.add_argument("--max-shard-size", default="5GB",
                   help="split weights into files of at most this size, with an index")
    p.add_argument("--lora", metavar="ADAPTER_DIR",
                   help="a PEFT LoRA adapter merged onto the weights: the merged model is "
                        "written")
    p.add_argument("--merged", action="store_true",
                   help="of a LoRA training run: the base with the adapters merged in, an HF "
                        "model (default: the adapters alone, as a PEFT adapter directory)")
    p.set_defaults(func=_export)
    startup.add_flags(p)

    p = add_command(sub, "random-model", help="write an HF directory with random weights in a "
                                              "Qwen2.5 or Qwen3 shape, and a word-level tokenizer")
    p.add_argument("--preset", default="tiny",
                   help="qwen2.5-0.5b ... qwen2.5-72b, qwen3-0.6b ... qwen3-32b; test shapes: "
                        "tiny, tiny-qwen3, small")
    p.add_argument("--out", required=True, metavar="HF_DIR")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="the stored weights' dtype")
    p.add_argument("--seed", type=seed, default=0, help="the weights' random seed")
    p.add_argument("--max-shard-size", default="5GB",
                   help="split weights into files of at most this size, with an index")
    p.set_defaults(func=_random_model)

    p = add_command(sub, "vocab", help="print the words (tokens) a model reads, one a line, in "
                                       "id order: those its tokenizer has and it has rows for")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="HF or checkpoint directory, or a shipped model's name")
    p.set_defaults(func=_vocab)


def _check_adapter(path: str | None) -> None:
    """--lora names a PEFT adapter directory (UserError, before the job starts)."""
    from memagent_jax.models.lora_config import ADAPTER_CONFIG, is_adapter_dir
    if path is not None and not is_adapter_dir(path):
        raise UserError(f"--lora: '{path}' is not a PEFT adapter directory (no "
                        f"{ADAPTER_CONFIG})")


def _convert(args) -> None:
    check_new_output(args.out, "--out")
    _check_adapter(args.lora)
    with _stop_before_writing(args.out) as poll:
        from memagent_jax.model_dir import side_files_dir
        from memagent_jax.models.loading import load_model, save_checkpoint
        from memagent_jax.models.sharding import job_mesh
        start(args)
        model, config = load_model(args.model, dtype=None, mesh=job_mesh(None), lora=args.lora)
        poll()  # Orbax's write is one call: the last point to stop at
        save_checkpoint(model, config, args.out, side_files_dir=side_files_dir(args.model))
    print_once(f"converted {args.model} -> {args.out} ({config.num_layers} layers, "
               f"{config.dtype})")


def _export(args) -> None:
    max_shard_bytes = _parse_size(args.max_shard_size)
    check_new_output(args.out, "--out")
    with _stop_before_writing(args.out) as poll:
        from memagent_jax.model_dir import side_files_dir
        from memagent_jax.models.checkpoint import lora_record
        from memagent_jax.models.loading import load_model, read_config, save_hf
        from memagent_jax.models.sharding import job_mesh
        read_config(args.model)  # a path that is no model fails here, before the job starts
        _check_adapter(args.lora)
        lora_run = lora_record(args.model) is not None
        if args.merged and not lora_run:
            raise UserError(f"--merged: {args.model} is no LoRA training run's checkpoint (its "
                            "export is the whole model already)")
        adapter_only = lora_run and not args.merged
        if adapter_only and args.lora:
            raise UserError("--lora: exporting a LoRA run's adapters alone; give --merged to "
                            "write the merged model with this adapter on it")
        start(args)
        if adapter_only:
            from memagent_jax.models.loading import read_run_adapters
            from memagent_jax.models.lora import write_peft
            config, lora, adapters, record = read_run_adapters(args.model, job_mesh(None))
            poll()
            write_peft(adapters, config, lora, args.out, base_model=record["path"])
            print_once(f"exported the LoRA adapters of {args.model} -> {args.out} (PEFT; "
                       "--merged: the merged model)")
            return
        model, config = load_model(args.model, dtype=None, mesh=job_mesh(None), lora=args.lora)
        save_hf(model, config, args.out, tokenizer_dir=side_files_dir(args.model),
                max_shard_bytes=max_shard_bytes, poll=poll)
    print_once(f"exported {args.model} -> {args.out}")


@contextlib.contextmanager
def _stop_before_writing(out: str):
    """Yields a poll (`stop_when_signalled`) for convert and export, listening from before
    JAX loads (a Ctrl-C then would land in one of its garbage-collection callbacks and be
    lost): Ctrl-C or SIGTERM while the model loads, or while it is written, stops at the next
    poll with nothing left at `out`; one after the last poll lets the write finish."""
    with PreemptionNotice(
            on_interrupt=f"Ctrl-C: stopping when the model has loaded or the tensor being "
                         f"written is done; {out} is kept only if it is complete by "
                         "then") as notice:
        yield stop_when_signalled(notice, lambda: f"nothing was written to {out}")


def _random_model(args) -> None:
    import tempfile

    from memagent_jax.data.needle import write_tokenizer
    from memagent_jax.models.loading import random_model, save_hf
    from memagent_jax.models.presets import preset_config
    max_shard_bytes = _parse_size(args.max_shard_size)
    check_new_output(args.out, "--out")
    config = preset_config(args.preset, dtype=args.dtype)
    _check_weights_fit(config, args, max_shard_bytes)
    with tempfile.TemporaryDirectory() as tokenizer_dir:
        # A word-level tokenizer with a chat template, so that `run` and text prompts work on
        # the model as they would on a real one (its few hundred ids fit every preset).
        write_tokenizer(tokenizer_dir)
        save_hf(random_model(config, seed=args.seed), config, args.out,
                tokenizer_dir=tokenizer_dir, max_shard_bytes=max_shard_bytes)
    print(f"wrote a random-weight {args.preset} model ({args.dtype}) with a word-level "
          f"tokenizer to {args.out}")


def _check_weights_fit(config, args, max_shard_bytes: int) -> None:
    """Refuses a preset whose random weights, and the file being written (a shard's copy on
    the host), cannot fit the device they are drawn on (`sizing.device_memory`), before any
    is drawn: Qwen2.5-72B's float32 weights took 290 GB until the system stopped the
    process, leaving a partial output behind."""
    import math

    import jax

    from memagent_jax.engine.sizing import check_fits
    from memagent_jax.models.loading import abstract_params
    weights = [math.prod(a.shape) for a in jax.tree.leaves(abstract_params(config))]
    size = sum(weights) * jax.numpy.dtype(config.dtype).itemsize
    count = sum(weights)
    count = f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.2f}M"
    check_fits(size + min(max_shard_bytes, size), [jax.devices()[0]],
               f"--preset {args.preset} --dtype {args.dtype}: {count} random weights and the "
               "file being written take")


def _vocab(args) -> None:
    from memagent_jax.models.loading import read_config
    from memagent_jax.tokenizer import PIECE_IDS, load_tokenizer
    config = read_config(args.model)
    tokenizer = load_tokenizer(args.model)
    if tokenizer is None:
        raise UserError(f"{args.model}: no tokenizer files (tokenizer.json) beside the model")
    readable = sorted(i for i in tokenizer.get_vocab().values()
                      if i < min(config.vocab_size, PIECE_IDS))
    for token in tokenizer.convert_ids_to_tokens(readable):
        # A word is stored as its byte-level spelling ("Ġcode" for " code").
        print(tokenizer.convert_tokens_to_string([token]).strip() or repr(token))


def _parse_size(text: str) -> int:
    """--max-shard-size: "5GB", "500MB", "20KB", "1024" (bytes) -> bytes; UserError unless
    positive."""
    units = {"KB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3, "B": 1}
    unit = next((u for u in units if text.upper().endswith(u)), None)  # "B" last
    number, scale = (text[: -len(unit)], units[unit]) if unit else (text, 1)
    try:
        size = int(float(number) * scale)
    except (ValueError, OverflowError):  # not a number; inf
        size = 0
    if size <= 0:
        raise UserError(f"--max-shard-size: expected a size such as 5GB or 500MB, got {text!r}")
    return size
