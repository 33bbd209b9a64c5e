"""`memagent-jax generate`: the JSONL contract end to end, and its bad-input errors."""

import json
import os

import pytest
import torch

from memagent_jax.cli import main
from tests.hf_reference import hf_model, write_hf_model, write_tiny_model

PREFIX = "memagent-jax: error: "


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("gen") / "m", seed=12)


def _write_lines(path, lines):
    path.write_text("".join(line if isinstance(line, str) else json.dumps(line) + "\n"
                            for line in lines))
    return str(path)


@pytest.mark.parametrize("prefill_rows", ["1", "3"])  # 3: padded to row counts 1, 2, 3
def test_generate_keeps_input_order_and_matches_transformers(model_dir, tmp_path, capsys,
                                                             prefill_rows):
    prompts = [{"prompt": "hello world the answer is"}, {"prompt_ids": [7, 8, 9]},
               {"prompt_ids": list(range(3, 60))}, {"prompt": "memory"}]
    src = _write_lines(tmp_path / "in.jsonl", prompts)
    out = str(tmp_path / "out.jsonl")
    assert main(["generate", "--model", model_dir, "--input", src, "--out", out,
                 "--max-new-tokens", "9", "--temperature", "0", "--slots", "4",
                 "--prefill-rows", prefill_rows]) == 0
    rows = [json.loads(line) for line in open(out)]
    assert len(rows) == 4
    reference = hf_model(seed=12)
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
    from memagent_jax.rollout.jsonl import write_completions
    path = str(tmp_path / "o.jsonl")
    write_completions(path, [{"completion_ids": [3], "text": "", "logprobs": [float("nan")],
                              "finish_reason": "length"}])
    line = open(path).read()
    assert json.loads(line, parse_constant=lambda c: pytest.fail(c))["logprobs"] == [None]


def test_ctrl_c_is_one_line_and_writes_nothing(model_dir, tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr("memagent_jax.rollout.scheduler.complete", interrupted)
    src = _write_lines(tmp_path / "in.jsonl", [{"prompt_ids": [1, 2]}])
    out = tmp_path / "out.jsonl"
    assert main(["generate", "--model", model_dir, "--input", src, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and not out.exists()
    assert err.strip().splitlines()[-1].startswith("memagent-jax: interrupted; nothing was "
                                                   "written")
