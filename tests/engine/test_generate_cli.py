"""`memagent-jax generate`: the JSONL contract end to end, and its bad-input errors."""

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest
import torch

from memagent_jax.cli import main
from tests.hf_reference import write_hf_model

pytestmark = pytest.mark.slow  # `generate` end to end, against transformers

PREFIX = "memagent-jax: error: "


def _write_lines(path, lines):
    path.write_text("".join(line if isinstance(line, str) else json.dumps(line) + "\n"
                            for line in lines))
    return str(path)


@pytest.mark.parametrize("prefill_rows", ["1", "3"])  # 3: padded to row counts 1, 2, 3
def test_generate_keeps_input_order_and_matches_transformers(model_dir, reference, tmp_path,
                                                             capsys, prefill_rows):
    prompts = [{"prompt": "hello world the answer is"}, {"prompt_ids": [7, 8, 9]},
               {"prompt_ids": list(range(3, 60))}, {"prompt": "memory"}]
    src = _write_lines(tmp_path / "in.jsonl", prompts)
    out = str(tmp_path / "out.jsonl")
    assert main(["generate", "--model", model_dir, "--input", src, "--out", out,
                 "--max-new-tokens", "9", "--temperature", "0", "--slots", "4",
                 "--prefill-rows", prefill_rows]) == 0
    rows = [json.loads(line) for line in open(out)]
    assert len(rows) == 4
    ids = [[3, 4, 6, 7, 8], [7, 8, 9], list(range(3, 60)), [9]]
    for row, prompt in zip(rows, ids):
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=9, do_sample=False,
                                      eos_token_id=2, pad_token_id=0)[0, len(prompt):].tolist()
        assert row["completion_ids"] == expected
        assert len(row["logprobs"]) == len(expected) and all(lp <= 0 for lp in row["logprobs"])
        assert row["finish_reason"] == ("stop" if expected[-1] == 2 else "length")
        assert isinstance(row["text"], str)
    assert "wrote 4 completions" in capsys.readouterr().out


def test_sampling_is_reproducible_by_seed(model_dir, tmp_path):
    src = _write_lines(tmp_path / "in.jsonl", [{"prompt_ids": [5, 6, 7]}] * 3)
    outputs = []
    for seed, name in [(1, "a"), (1, "b"), (2, "c")]:
        out = str(tmp_path / f"{name}.jsonl")
        assert main(["generate", "--model", model_dir, "--input", src, "--out", out,
                     "--max-new-tokens", "12", "--temperature", "1.0", "--top-p", "0.9",
                     "--seed", str(seed)]) == 0
        outputs.append([json.loads(line)["completion_ids"] for line in open(out)])
    assert outputs[0] == outputs[1] and outputs[0] != outputs[2]


@pytest.mark.parametrize("lines,extra,named", [
    ([{"prompt_ids": [1, 2]}, {"prompt_ids": []}], [], "line 2: empty prompt"),
    ([{"prompt": ""}], [], "line 1: empty prompt"),
    ([{"prompt_ids": [1, 2]}, '{"prompt_ids": [1, 2\n'], [],
     "line 2: not valid JSON: Expecting ',' delimiter at the end of the line"),
    (['{"prompt": "a\tb"}\n'], [],
     "line 1: not valid JSON: Invalid control character at column 14"),
    ([{"prompt_ids": [1, 2]}], ["--temperature", "-0.5"],
     "error: --temperature must be a number >= 0 (0 is greedy), got -0.5"),
    ([{"prompt_ids": [1, 2]}], ["--temperature", "nan"], "--temperature must be a number >= 0"),
    ([{"prompt_ids": [1, 2]}], ["--top-p", "0"],
     "error: --top-p must be in (0, 1] (1: off), got 0.0"),
    ([{"prompt_ids": [1, 2]}], ["--top-k", "-1"], "error: --top-k must be >= 0 (0: off), got -1"),
    ([{"text": "hi"}], [], "line 1: expected an object"),
    ([{"prompt_ids": list(range(3, 40))}], ["--max-len", "32"], "37 tokens do not fit"),
    ([{"prompt_ids": [1, 2]}], ["--max-new-tokens", "0"], "--max-new-tokens must be positive"),
    ([{"prompt_ids": [1, 2]}], ["--prefill-rows", "0"], "--prefill-rows must be at least 1"),
    ([{"prompt_ids": [1, 2]}, {"prompt_ids": [785, 6722, 315]}], [],
     "line 2: token id 785 is outside the model's vocabulary of 101 ids"),
    ([{"prompt_ids": [1, 2]}, {"prompt_ids": [3, 70, 99]}], [],
     ("line 2: token id 70 has no token in the tokenizer's vocabulary of 66 (its text would "
      "be empty)")),
    ([{"prompt": "hello zaludo"}], [], "line 1: the tokenizer has no token for 'zaludo'"),
    ([{"prompt_ids": [1, 2]}], ["--max-new-tokens", "100000"],
     "2 tokens do not fit the model's context window of 512 with --max-new-tokens 100000"),
    ([{"prompt_ids": [1, 2]}], ["--max-len", "64", "--max-new-tokens", "63"],
     "2 tokens do not fit --max-len 64 with --max-new-tokens 63"),
])
def test_bad_input_is_one_clear_line(model_dir, tmp_path, capsys, lines, extra, named):
    src = _write_lines(tmp_path / "in.jsonl", lines)
    out = str(tmp_path / "out.jsonl")
    code = main(["generate", "--model", model_dir, "--input", src, "--out", out] + extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and err[0].startswith(PREFIX) and named in err[0], err
    assert not os.path.exists(out)


def test_a_prompt_and_new_tokens_that_exactly_fill_the_limit_are_generated(model_dir, tmp_path):
    """2 prompt tokens and --max-new-tokens 62 fill --max-len 64 exactly: accepted (63 is the
    first refused, above)."""
    src = _write_lines(tmp_path / "in.jsonl", [{"prompt_ids": [5, 6]}])
    out = tmp_path / "out.jsonl"
    assert main(["generate", "--model", model_dir, "--input", src, "--out", str(out),
                 "--max-len", "64", "--max-new-tokens", "62", "--temperature", "0"]) == 0
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert 0 < len(row["completion_ids"]) <= 62


def test_missing_model_and_missing_input(tmp_path, model_dir, capsys):
    src = _write_lines(tmp_path / "in.jsonl", [{"prompt_ids": [1]}])
    assert main(["generate", "--model", str(tmp_path / "nope"), "--input", src,
                 "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "nope': model directory not found" in capsys.readouterr().err
    assert main(["generate", "--model", model_dir, "--input", str(tmp_path / "none.jsonl"),
                 "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "none.jsonl: not found" in capsys.readouterr().err


@pytest.mark.parametrize("where, named", [
    ("no_dir/out.jsonl", "does not exist"),
    ("a_dir", "is a directory"),
])
def test_an_unwritable_output_fails_before_any_work(model_dir, tmp_path, capsys, where, named):
    (tmp_path / "a_dir").mkdir()
    src = _write_lines(tmp_path / "in.jsonl", [{"prompt_ids": [1, 2]}])
    assert main(["generate", "--model", model_dir, "--input", src,
                 "--out", str(tmp_path / where)]) == 2
    err = capsys.readouterr().err
    assert named in err and "tmp-" not in err and "generate" not in err  # no progress bar


@pytest.mark.parametrize("flag", ["--out", "--output"])  # --output: the old name, kept
def test_an_existing_output_is_refused_before_any_work(model_dir, tmp_path, capsys, flag):
    """As every command's outputs (export, data): never overwritten, and no --force."""
    src = _write_lines(tmp_path / "in.jsonl", [{"prompt_ids": [1, 2]}])
    out = tmp_path / "out.jsonl"
    out.write_text("kept\n")
    assert main(["generate", "--model", model_dir, "--input", src, flag, str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"{PREFIX}--out: {out} exists; remove it or choose another --out"], err
    assert out.read_text() == "kept\n"


def test_a_text_prompt_without_a_tokenizer_names_the_flag(tmp_path, capsys):
    model = write_hf_model(tmp_path / "m", seed=12)  # no tokenizer files
    capsys.readouterr()
    src = _write_lines(tmp_path / "in.jsonl", [{"prompt": "hello"}])
    assert main(["generate", "--model", model, "--input", src,
                 "--out", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"{PREFIX}{src} line 1: a text 'prompt' needs a tokenizer and the model "
                   "directory has none: pass --tokenizer DIR, or give 'prompt_ids'"], err


def test_a_tokenizer_directory_without_tokenizer_files_is_refused(model_dir, tmp_path, capsys):
    """--tokenizer DIR is read, not skipped: prompt_ids alone need no tokenizer, but one named
    must be there."""
    src = _write_lines(tmp_path / "in.jsonl", [{"prompt_ids": [1, 2]}])
    out = tmp_path / "o.jsonl"
    assert main(["generate", "--model", model_dir, "--input", src, "--out", str(out),
                 "--tokenizer", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"{PREFIX}--tokenizer '{tmp_path}' has no tokenizer files (tokenizer.json / "
                   "tokenizer_config.json)"], err
    assert not out.exists()


def test_a_directory_given_as_the_input_says_so(model_dir, tmp_path, capsys):
    assert main(["generate", "--model", model_dir, "--input", str(tmp_path),
                 "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "is a directory, expected a file" in capsys.readouterr().err


def test_non_finite_logprobs_are_written_as_null(tmp_path):
    from memagent_jax.engine.jsonl import write_completions
    path = str(tmp_path / "o.jsonl")
    write_completions(path, [{"completion_ids": [3], "text": "", "logprobs": [float("nan")],
                              "finish_reason": "length"}])
    line = open(path).read()
    assert json.loads(line, parse_constant=lambda c: pytest.fail(c))["logprobs"] == [None]


@pytest.mark.parametrize("signum, status, cause", [(signal.SIGINT, 130, "interrupted (Ctrl-C)"),
                                                   (signal.SIGTERM, 143, "stopped (SIGTERM)")])
def test_a_signal_finishes_the_engine_step_it_lands_in_then_stops_writing_nothing(
        model_dir, tmp_path, capsys, monkeypatch, signum, status, cause):
    """Ctrl-C (or SIGTERM) during an engine step: the step runs to its end (a
    KeyboardInterrupt raised inside it could leave an XLA compile running while the process
    exits, which crashed it, exit 139), the command stops before the next one, writes
    nothing, and says so in one line: exit 130 (143)."""
    from memagent_jax.engine.scheduler import Scheduler
    step, steps = Scheduler.step, []

    def signalled_in_step_3(self, placed):
        steps.append("started")
        if len(steps) == 3:
            os.kill(os.getpid(), signum)
        busy = step(self, placed)
        steps[-1] = "finished"
        return busy

    def raised_in_the_step(signum, frame):  # where the command's own handling is missing
        raise AssertionError(f"signal {signum} raised in the middle of an engine step")

    monkeypatch.setattr(Scheduler, "step", signalled_in_step_3)
    handlers = {s: signal.signal(s, raised_in_the_step) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        src = _write_lines(tmp_path / "in.jsonl", [{"prompt_ids": [1, 2]}] * 2)
        out = tmp_path / "out.jsonl"
        assert main(["generate", "--model", model_dir, "--input", src, "--out", str(out),
                     "--max-new-tokens", "50"]) == status
        assert steps == ["finished"] * 3  # the signal's step ended, and no other began
        for s in handlers:  # given back
            assert signal.getsignal(s) is raised_in_the_step
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    err = capsys.readouterr().err
    assert "Traceback" not in err and not out.exists()
    assert err.strip().splitlines()[-1] == (
        f"memagent-jax: {cause}; nothing was written ({out} is written once every prompt has "
        "finished)")


def test_ctrl_c_pressed_again_and_again_exits_130_every_time(model_dir, tmp_path):
    """`generate` as a process, Ctrl-C'd three times at once as its engine starts (the first
    steps compile) or a little later, 3 runs: exit 130 and the one line each time, within
    seconds (1 Ctrl-C in 3 crashed the process at exit, status 139, where it landed in an XLA
    compile). stderr is a terminal, where the progress bar shows as the engine starts."""
    src = _write_lines(tmp_path / "in.jsonl", [{"prompt_ids": [1, 2, 3]}] * 64)
    for run in range(3):
        out = tmp_path / f"out{run}.jsonl"
        terminal, stderr = pty.openpty()
        fcntl.ioctl(stderr, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 0 wide
        # draws no bar
        command = subprocess.Popen(
            [sys.executable, "-m", "memagent_jax.cli", "generate", "--model", model_dir,
             "--input", src, "--out", str(out), "--max-new-tokens", "400", "--slots", "4"],
            stdout=subprocess.DEVNULL, stderr=stderr)
        os.close(stderr)
        try:
            err = _read_until(terminal, b"generate:", deadline=time.monotonic() + 60)
            time.sleep(0.1 * run)  # the Ctrl-Cs land at other points of its work
            for _ in range(3):
                command.send_signal(signal.SIGINT)
            command.wait(timeout=60)
            err = (err + _read_until(terminal, None, time.monotonic() + 5)).decode()
        finally:
            command.kill()
            os.close(terminal)
        assert command.returncode == 130, err
        assert err.replace("\r", "\n").strip().splitlines()[-1].startswith(
            "memagent-jax: interrupted (Ctrl-C); nothing was written"), err
        assert not out.exists()


def _read_until(terminal: int, marker: bytes | None, deadline: float) -> bytes:
    """What the pseudo-terminal `terminal` gives until `marker` (None: until it closes)."""
    read = b""
    while marker is None or marker not in read:
        if time.monotonic() > deadline:
            pytest.fail(f"no {marker!r} in time: {read!r}")
        if select.select([terminal], [], [], 0.1)[0]:
            try:
                chunk = os.read(terminal, 4096)
            except OSError:  # the process closed its end (EIO)
                chunk = b""
            if not chunk:
                if marker is None:
                    return read
                pytest.fail(f"ended before {marker!r}: {read!r}")
            read += chunk
    return read