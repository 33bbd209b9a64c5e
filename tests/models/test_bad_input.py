"""Bad input to `convert`, `export` and `load_model`: one clear error, nothing left behind.

Every failing command must print exactly one line, `memagent-jax: error: ...`, naming the file,
key or value at fault, exit non-zero without a traceback, and leave neither the output directory
nor a hidden temporary sibling (`.NAME.tmp-*`) behind. The CLI runs in-process (`cli.main`
returns the exit status); one test goes through the installed console script end to end.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from memagent_jax import cli
from memagent_jax.errors import UserError
from memagent_jax.models import hf_checkpoint
from memagent_jax.models.loading import load_model
from tests.full_disk import TENSORSTORE_ENOSPC, fail_orbax_writes, fill_disk_after
from tests.hf_reference import write_hf_model, write_tiny_tokenizer
from tests.synthetic.signals import ctrl_c_in_a_gc_callback_at

PREFIX = "memagent-jax: error: "


# ------------------------------------------------------------------------------------ helpers

@pytest.fixture(scope="module")
def hf_single(tmp_path_factory):
    """A good tiny HF directory with one model.safetensors (tests copy it before editing)."""
    return write_hf_model(tmp_path_factory.mktemp("good") / "hf", seed=0)


@pytest.fixture(scope="module")
def hf_sharded(tmp_path_factory):
    """A good tiny HF directory split into several shards with an index."""
    path = write_hf_model(tmp_path_factory.mktemp("good") / "hf_sharded", seed=0,
                          max_shard_size="20KB")
    assert os.path.isfile(os.path.join(path, hf_checkpoint.INDEX_FILE))
    return path


@pytest.fixture(scope="module")
def good_ckpt(hf_single, tmp_path_factory):
    """A memagent-jax checkpoint converted from hf_single."""
    out = str(tmp_path_factory.mktemp("good") / "ckpt")
    assert cli.main(["convert", "--model", hf_single, "--out", out]) == 0
    return out


def _copy(src: str, tmp_path) -> str:
    dst = str(tmp_path / "hf")
    shutil.copytree(src, dst)
    return dst


def _edit_config(hf_dir: str, edit) -> str:
    return _edit_config_file(os.path.join(hf_dir, "config.json"), edit)


def _edit_config_file(path: str, edit) -> str:
    with open(path) as f:
        config = json.load(f)
    edit(config)
    with open(path, "w") as f:
        json.dump(config, f)
    return path


def _leftovers(out: str) -> list[str]:
    """Hidden temporary siblings of out left by an interrupted write."""
    parent, name = os.path.split(os.path.abspath(out))
    if not os.path.isdir(parent):
        return []
    return [n for n in os.listdir(parent) if n.startswith(f".{name}.tmp-")]


def _assert_nothing_written(out: str, existing: dict[str, str] | None = None) -> None:
    """out is absent (or, if it existed before, holds exactly `existing`), and no temp dir."""
    if existing is None:
        assert not os.path.exists(out), f"partial output left behind: {os.listdir(out)}"
    else:
        assert sorted(os.listdir(out)) == sorted(existing)
        for name, text in existing.items():
            with open(os.path.join(out, name)) as f:
                assert f.read() == text, f"{name} was modified"
    assert _leftovers(out) == []


def fails_cleanly(capsys, argv: list[str], out: str | None, *names: str,
                  existing: dict[str, str] | None = None) -> str:
    """Runs the CLI in-process and checks the failure contract; returns the error line."""
    code = cli.main(argv)
    captured = capsys.readouterr()
    assert code != 0
    assert "Traceback" not in captured.err + captured.out
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, f"expected one error line, got:\n{captured.err}"
    line = lines[0]
    assert line.startswith(PREFIX), line
    for name in names:
        assert name in line, f"{name!r} not named in: {line}"
    if out is not None:
        _assert_nothing_written(out, existing)
    return line


# ------------------------------------------------------------------------ convert: HF input

def test_missing_config_json(capsys, hf_single, tmp_path):
    hf = _copy(hf_single, tmp_path)
    os.remove(os.path.join(hf, "config.json"))
    out = str(tmp_path / "ckpt")
    fails_cleanly(capsys, ["convert", "--model", hf, "--out", out], out,
                  os.path.join(hf, "config.json"), "not found")


def test_no_safetensors_file(capsys, hf_single, tmp_path):
    hf = _copy(hf_single, tmp_path)
    os.remove(os.path.join(hf, "model.safetensors"))
    out = str(tmp_path / "ckpt")
    fails_cleanly(capsys, ["convert", "--model", hf, "--out", out], out,
                  hf, "model.safetensors")


def test_missing_shard(capsys, hf_sharded, tmp_path):
    hf = _copy(hf_sharded, tmp_path)
    with open(os.path.join(hf, hf_checkpoint.INDEX_FILE)) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    assert len(shards) >= 3
    missing = os.path.join(hf, shards[1])
    os.remove(missing)
    out = str(tmp_path / "ckpt")
    fails_cleanly(capsys, ["convert", "--model", hf, "--out", out], out, missing, "not found")


@pytest.mark.parametrize("keep", ["half", 20, 4], ids=["half", "in_header", "no_header"])
def test_truncated_safetensors(capsys, hf_single, tmp_path, keep):
    hf = _copy(hf_single, tmp_path)
    path = os.path.join(hf, "model.safetensors")
    size = os.path.getsize(path)
    os.truncate(path, size // 2 if keep == "half" else keep)
    out = str(tmp_path / "ckpt")
    fails_cleanly(capsys, ["convert", "--model", hf, "--out", out], out, path, "truncated")


def test_shape_disagrees_with_config(capsys, hf_single, tmp_path):
    hf = _copy(hf_single, tmp_path)
    _edit_config(hf, lambda c: c.update(intermediate_size=64))  # the weights have 48
    out = str(tmp_path / "ckpt")
    line = fails_cleanly(capsys, ["convert", "--model", hf, "--out", out], out,
                         os.path.join(hf, "model.safetensors"),
                         "'model.layers.0.mlp.gate_proj.weight'", "[48, 32]", "[64, 32]")
    assert "shape" in line


def test_rewritten_tensor_has_wrong_shape(capsys, hf_single, tmp_path):
    from safetensors.numpy import load_file, save_file
    hf = _copy(hf_single, tmp_path)
    path = os.path.join(hf, "model.safetensors")
    tensors = load_file(path)
    tensors["model.norm.weight"] = tensors["model.norm.weight"][:-1].copy()  # [32] -> [31]
    save_file(tensors, path, metadata={"format": "pt"})
    out = str(tmp_path / "ckpt")
    fails_cleanly(capsys, ["convert", "--model", hf, "--out", out], out,
                  path, "'model.norm.weight'", "[31]", "[32]")


@pytest.mark.parametrize("model_type,archs,named", [
    ("llama", ["LlamaForCausalLM"], "LlamaForCausalLM"),
    ("qwen2", ["Qwen2ForSequenceClassification"], "Qwen2ForSequenceClassification"),
    ("qwen3_moe", None, "qwen3_moe"),  # Qwen3's mixture-of-experts models are out of scope
    ("qwen3", ["Qwen3MoeForCausalLM"], "Qwen3MoeForCausalLM"),
    ("qwen2", ["Qwen3ForCausalLM"], "Qwen3ForCausalLM"),  # architecture and type disagree
])
def test_unsupported_architecture(capsys, hf_single, tmp_path, model_type, archs, named):
    hf = _copy(hf_single, tmp_path)

    def edit(c):
        c["model_type"] = model_type
        if archs is None:
            c.pop("architectures", None)
        else:
            c["architectures"] = archs
    config = _edit_config(hf, edit)
    out = str(tmp_path / "ckpt")
    line = fails_cleanly(capsys, ["convert", "--model", hf, "--out", out], out, config, named)
    assert "unsupported architecture" in line


def _longrope(c):
    c["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 10000.0,
                            "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
                            "original_max_position_embeddings": 256}


def _old_dynamic(c):  # transformers 4 form: no rope_parameters, top-level rope_scaling
    c.pop("rope_parameters", None)
    c["rope_theta"] = 10000.0
    c["rope_scaling"] = {"type": "dynamic", "factor": 2.0}


@pytest.mark.parametrize("edit,rope_type,key", [
    (_longrope, "longrope", "rope_parameters"),
    (_old_dynamic, "dynamic", "rope_scaling"),
], ids=["rope_parameters-longrope", "rope_scaling-dynamic"])
def test_unsupported_rope_type(capsys, hf_single, tmp_path, edit, rope_type, key):
    hf = _copy(hf_single, tmp_path)
    config = _edit_config(hf, edit)
    out = str(tmp_path / "ckpt")
    fails_cleanly(capsys, ["convert", "--model", hf, "--out", out], out,
                  config, f"'{rope_type}'", f"'{key}'")


@pytest.mark.parametrize("key,value,named", [
    ("attention_bias", True, "'attention_bias'"),
    ("layer_types", ["full_attention", "sliding_attention"], "'layer_types'"),
])
def test_qwen3_variant_not_supported(capsys, tmp_path, key, value, named):
    """A Qwen3 config.json with q/k/v/o biases or sliding-window layers (no Qwen3 checkpoint
    has them) is refused by name rather than loaded wrong."""
    hf = write_hf_model(tmp_path / "hf", seed=0, arch="qwen3")
    capsys.readouterr()  # transformers' progress bar
    config = _edit_config(hf, lambda c: c.update({key: value}))
    out = str(tmp_path / "ckpt")
    fails_cleanly(capsys, ["convert", "--model", hf, "--out", out], out, config, named)


def test_hf_dir_does_not_exist(capsys, tmp_path):
    hf, out = str(tmp_path / "nowhere"), str(tmp_path / "ckpt")
    fails_cleanly(capsys, ["convert", "--model", hf, "--out", out], out, hf, "not found")


def test_load_model_path_does_not_exist(tmp_path):
    missing = str(tmp_path / "no_such_model")
    with pytest.raises(UserError, match="no_such_model"):
        load_model(missing)


# ------------------------------------------------------------------------ existing outputs

@pytest.mark.parametrize("as_file", [False, True], ids=["dir_with_file", "is_a_file"])
def test_convert_output_exists_and_not_empty(capsys, hf_single, tmp_path, as_file):
    out = str(tmp_path / "ckpt")
    if as_file:
        with open(out, "w") as f:
            f.write("precious\n")
    else:
        os.makedirs(out)
        with open(os.path.join(out, "notes.txt"), "w") as f:
            f.write("precious\n")
    fails_cleanly(capsys, ["convert", "--model", hf_single, "--out", out], None, out,
                  "is a file, not a directory" if as_file else "not empty")
    if as_file:
        with open(out) as f:
            assert f.read() == "precious\n"
        assert _leftovers(out) == []
    else:
        _assert_nothing_written(out, existing={"notes.txt": "precious\n"})


def test_export_target_exists_and_not_empty(capsys, good_ckpt, tmp_path):
    out = str(tmp_path / "exported")
    os.makedirs(out)
    with open(os.path.join(out, "model.safetensors"), "w") as f:
        f.write("not yours\n")
    fails_cleanly(capsys, ["export", "--model", good_ckpt, "--out", out], out, out, "not empty",
                  existing={"model.safetensors": "not yours\n"})


def test_export_into_empty_existing_dir_is_fine(capsys, good_ckpt, tmp_path):
    out = str(tmp_path / "exported")
    os.makedirs(out)
    assert cli.main(["export", "--model", good_ckpt, "--out", out]) == 0
    assert os.path.isfile(os.path.join(out, "model.safetensors"))
    assert _leftovers(out) == []


# ------------------------------------------------------------------------ export: bad input

@pytest.mark.parametrize("kind", ["missing", "file", "no_model"])
def test_export_model_is_not_a_model(capsys, tmp_path, kind):
    if kind == "missing":
        ckpt, named = str(tmp_path / "no_ckpt"), "model directory not found"
    elif kind == "file":
        ckpt, named = str(tmp_path / "weights.bin"), "model directory not found"
        with open(ckpt, "wb") as f:
            f.write(b"\0" * 64)
    else:
        ckpt, named = str(tmp_path), "neither an HF model directory nor a memagent-jax checkpoint"
    out = str(tmp_path / "exported")
    fails_cleanly(capsys, ["export", "--model", ckpt, "--out", out], out, ckpt, named)


def test_export_writes_an_hf_directory_again(hf_single, tmp_path, capsys):
    """An HF directory given by its path exports as a shipped model's name does (resharded):
    the same tensors, and the tokenizer beside them."""
    hf, out = _copy(hf_single, tmp_path), tmp_path / "exported"
    write_tiny_tokenizer(hf)
    assert cli.main(["export", "--model", hf, "--out", str(out),
                     "--max-shard-size", "20KB"]) == 0
    assert capsys.readouterr().out == f"exported {hf} -> {out}\n"
    before, after = hf_checkpoint.scan_weights(hf), hf_checkpoint.scan_weights(str(out))
    assert before.keys() == after.keys()
    for name, info in before.items():
        np.testing.assert_array_equal(info.read(), after[name].read(), err_msg=name)
    assert os.path.isfile(out / hf_checkpoint.INDEX_FILE)
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(out))


def test_a_checkpoint_given_by_a_relative_path_loads(hf_single, tmp_path, monkeypatch):
    """Orbax takes absolute paths only: a relative one is made absolute before it gets it
    (`export` here; `generate`, `run` and `eval` load a checkpoint the same way)."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["convert", "--model", hf_single, "--out", "ckpt"]) == 0
    assert cli.main(["export", "--model", "ckpt", "--out", "exported"]) == 0
    before, after = hf_checkpoint.scan_weights(hf_single), hf_checkpoint.scan_weights("exported")
    for name, info in before.items():
        np.testing.assert_array_equal(info.read(), after[name].read(), err_msg=name)


@pytest.mark.parametrize("layout", ["deeper_config", "stacked_layers"])
def test_checkpoint_tree_differs_from_its_config(capsys, good_ckpt, tmp_path, layout):
    """A checkpoint whose parameters are not the ones its model_config.json implies: a config
    edited to one more layer, or the stacked layer arrays memagent-jax wrote before it stored
    one array per layer."""
    ckpt = str(tmp_path / "ckpt")
    shutil.copytree(good_ckpt, ckpt)
    if layout == "deeper_config":
        _edit_config_file(os.path.join(ckpt, "model_config.json"),
                          lambda c: c.update(num_hidden_layers=c["num_hidden_layers"] + 1))
        named = "missing 'layers/2/attn_norm'"
    else:
        import numpy as np
        import orbax.checkpoint as ocp

        from memagent_jax.models.mapping import flatten
        params = ocp.StandardCheckpointer().restore(os.path.join(ckpt, "params"))
        layers = [flatten(params["layers"][i]) for i in sorted(params["layers"], key=int)]
        params["layers"] = {path.split("/")[-1]: np.stack([layer[path] for layer in layers])
                            for path in layers[0]}
        shutil.rmtree(os.path.join(ckpt, "params"))
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(os.path.join(ckpt, "params"), params)
        checkpointer.wait_until_finished()
        named = "unexpected 'layers/attn_norm'"
    out = str(tmp_path / "exported")
    line = fails_cleanly(capsys, ["export", "--model", ckpt, "--out", out], out,
                         os.path.join(ckpt, "params"), named)
    assert "convert" in line


@pytest.mark.parametrize("size", ["abc", "0", "-1KB", "5XB", "", "inf", "1e400", "nan"])
def test_bad_max_shard_size(capsys, good_ckpt, tmp_path, size):
    out = str(tmp_path / "exported")
    fails_cleanly(capsys, ["export", "--model", good_ckpt, "--out", out,
                           f"--max-shard-size={size}"], out, "--max-shard-size", repr(size))


def test_bad_max_shard_size_random_model(capsys, tmp_path):
    out = str(tmp_path / "random")
    fails_cleanly(capsys, ["random-model", "--out", out, "--max-shard-size", "lots"], out,
                  "--max-shard-size", "'lots'")


def test_random_weights_the_memory_cannot_hold_are_refused_before_any_is_drawn(
        capsys, tmp_path, monkeypatch):
    """(Qwen2.5-72B's float32 weights, 291 GB, were drawn until the system stopped the
    process and left a hidden temporary directory behind.) Here: the tiny preset, given 1 MiB
    of memory to use."""
    from memagent_jax.engine import sizing
    monkeypatch.setattr(sizing, "usable_memory", lambda: 2 ** 20)
    out = str(tmp_path / "random")
    line = fails_cleanly(capsys, ["random-model", "--preset", "tiny", "--out", out], out)
    assert re.fullmatch(PREFIX + r"--preset tiny --dtype float32: 0\.14M random weights and "
                        r"the file being written take \d+\.\d MiB, over the 1\.0 MiB of host "
                        r"memory this process can use", line), line


# ------------------------------------------------------------------- failures while writing

def test_export_on_a_full_disk_is_one_line_and_leaves_nothing(capsys, good_ckpt, tmp_path,
                                                              monkeypatch):
    """The disk fills up in the middle of the second shard's bytes: one line naming the
    output, no output, no temp dir; with space again the same command writes it."""
    out = str(tmp_path / "exported")
    argv = ["export", "--model", good_ckpt, "--out", out, "--max-shard-size", "20KB"]
    with monkeypatch.context() as patched:
        disk = fill_disk_after(patched, tmp_path, 30_000)
        line = fails_cleanly(capsys, argv, out)
    assert line == (f"{PREFIX}no space left on device writing {out}; nothing of it was kept "
                    "(free some space and run the command again)")
    assert disk["written"] == 30_000  # the first shard (about 20 KB) was written, and more
    assert cli.main(argv) == 0


def test_convert_on_a_full_disk_is_one_line_and_leaves_nothing(capsys, hf_single, tmp_path,
                                                               monkeypatch):
    """Orbax's write of the parameters fails as TensorStore's does on a full disk (in its own
    thread, with a checkpoint half written): one line naming the output, nothing left."""
    out = str(tmp_path / "ckpt")
    failed = fail_orbax_writes(monkeypatch)
    line = fails_cleanly(capsys, ["convert", "--model", hf_single, "--out", out], out)
    assert line == (f"{PREFIX}no space left on device writing {out}; nothing of it was kept "
                    "(free some space and run the command again)")
    assert failed and all(".ckpt.tmp-" in where for where in failed)


def test_export_interrupted_midway_leaves_nothing(good_ckpt, tmp_path, monkeypatch):
    real_write, written = hf_checkpoint.write_file, []

    def write_then_interrupt(path, tensors):
        if written:
            raise KeyboardInterrupt
        real_write(path, tensors)
        written.append(path)

    monkeypatch.setattr(hf_checkpoint, "write_file", write_then_interrupt)
    out = str(tmp_path / "exported")
    assert cli.main(["export", "--model", good_ckpt, "--out", out, "--max-shard-size",
                     "20KB"]) == 130   # one line, no traceback (cli.main)
    assert len(written) == 1
    _assert_nothing_written(out)


def test_what_orbax_prints_after_a_full_disk_is_kept_off_stderr(monkeypatch):
    """The tracebacks Orbax's threads print once a write failed for a full disk (seen on a
    real one: tests/e2e/test_full_disk.py) are dropped; other errors are not."""
    from memagent_jax.models import checkpoint

    passed_on = []
    monkeypatch.setattr(checkpoint, "_quieted", False)
    monkeypatch.setattr(sys, "unraisablehook", passed_on.append)
    loggers = [logging.getLogger(name) for name in ("absl", "asyncio")]
    for logger in loggers:
        monkeypatch.setattr(logger, "filters", [])
    checkpoint.quiet_failed_writes()

    closed, other = (SimpleNamespace(exc_value=RuntimeError(text), object=None)
                     for text in ("Event loop is closed", "something else"))
    sys.unraisablehook(closed)
    sys.unraisablehook(other)
    assert passed_on == [other]

    orbax_file = os.path.join("site-packages", "orbax", "checkpoint", "future.py")
    full = ValueError(TENSORSTORE_ENOSPC.format(path="/ckpt"))

    def kept(logger, path, error, message="_SignalingThread.run() raised an exception"):
        return logger.filter(logging.LogRecord(logger.name, logging.ERROR, path, 1, message,
                                               None, (type(error), error, None)))

    absl, asyncio_logger = loggers
    assert not kept(absl, orbax_file, full)
    assert not kept(asyncio_logger, "asyncio/base_events.py", full,
                    f"Task exception was never retrieved: coro defined at {orbax_file}")
    never_retrieved = "Future exception was never retrieved\nfuture: <Future finished exception="
    assert not kept(asyncio_logger, "asyncio/base_events.py", full,
                    f"{never_retrieved}{full!r}>")  # TensorStore's write, named nowhere
    assert kept(asyncio_logger, "asyncio/base_events.py", ValueError("another failure"),
                f"{never_retrieved}ValueError('another failure')>")
    assert kept(absl, orbax_file, ValueError("another failure"))
    assert kept(absl, "elsewhere.py", full)


def test_ctrl_c_while_the_model_loads_stops_the_export_with_nothing_written(
        good_ckpt, tmp_path, monkeypatch, capsys):
    """Ctrl-C as it lands in practice while Orbax restores the parameters: in a garbage
    collection's callback, where Python drops a KeyboardInterrupt (the export went on to the
    end). It stops before the first tensor is written, in one line."""
    from memagent_jax.models import checkpoint

    ctrl_c_in_a_gc_callback_at(monkeypatch, checkpoint, "read_params")
    out = str(tmp_path / "exported")
    assert cli.main(["export", "--model", good_ckpt, "--out", out]) == 130
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip().splitlines()[-1] == (
        f"memagent-jax: interrupted (Ctrl-C); nothing was written to {out}")
    assert "Traceback" not in captured.err and "Exception ignored" not in captured.err
    _assert_nothing_written(out)


def test_convert_failure_midway_leaves_nothing(capsys, hf_single, tmp_path, monkeypatch):
    """Parameters already saved by Orbax, then copying the side files fails."""
    from memagent_jax.models import checkpoint

    def fail(src, dst):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES),
                              os.path.join(dst, "tokenizer.json"))

    monkeypatch.setattr(checkpoint, "copy_side_files", fail)
    out = str(tmp_path / "ckpt")
    fails_cleanly(capsys, ["convert", "--model", hf_single, "--out", out], out,
                  "Permission denied", "tokenizer.json")


# ------------------------------------------------------------------------- end to end

def test_console_script_exit_status_and_stderr(hf_single, tmp_path):
    hf = _copy(hf_single, tmp_path)
    os.remove(os.path.join(hf, "config.json"))
    out = str(tmp_path / "ckpt")
    script = os.path.join(os.path.dirname(sys.executable), "memagent-jax")
    command = [script] if os.path.isfile(script) else [sys.executable, "-m", "memagent_jax.cli"]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    result = subprocess.run(command + ["convert", "--model", hf, "--out", out],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(PREFIX)
    assert os.path.join(hf, "config.json") in lines[0]
    _assert_nothing_written(out)
