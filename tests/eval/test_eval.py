"""`memagent-jax eval`: scoring and tables (scripted answers), resume after a crash, bad input,
and end-to-end runs of the memory agent and the full-context baseline with a tiny model."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from memagent_jax.cli import main
from memagent_jax.data.hotpotqa import read_corpus, ruler_hqa_records
from memagent_jax.data.io import load_source, write_set
from memagent_jax.errors import UserError
from memagent_jax.eval import runner
from memagent_jax.eval.methods import FullContextMethod
from memagent_jax.eval.runner import run_eval
from memagent_jax.tokenizer import load_tokenizer
from tests.builders import Scripted, block_package, eval_config, hotpot_rows
from tests.hf_reference import write_tiny_model

pytestmark = pytest.mark.slow  # evaluations end to end

CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "eval" / "tiny_cpu.yaml")
PREFIX = "memagent-jax: error: "


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """RULER-HQA sets with 12 and 20 documents per sample, 4 questions each."""
    root = tmp_path_factory.mktemp("sets")
    source = root / "hotpot.json"
    source.write_text(json.dumps(hotpot_rows()))
    corpus = read_corpus(load_source(str(source)), str(source))
    paths = []
    for n in (12, 20):
        paths.append(str(root / f"eval_{n}.json"))
        write_set(paths[-1], ruler_hqa_records(corpus, n, [0, 1, 2, 3]))
    return paths


def _cli(model_dir, sets, out, *overrides) -> int:
    return main(["eval", "--config", CONFIG, f"model.path={model_dir}",
                 f"data.sets={json.dumps(sets)}", f"output_dir={out}", *overrides])


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


REPLIES = {0: ("so \\boxed{France}", "\\boxed{Germany}"),      # sub-EM 1, 0
           1: ("\\boxed{Yes.}", "\\boxed yes"),                 # EM after normalising; the
                                                                # original reads `\boxed yes`
           2: ("\\boxed{named in 1846 by Fremont}",) * 2,       # sub-EM 1, EM 0, F1 1/3
           3: ("no box at all",) * 2}                           # no answer: 0


def test_scores_per_sample_and_table(model_dir, sets, tmp_path):
    out = tmp_path / "out"
    method = Scripted(lambda s, row, k: REPLIES[row][k])
    summary = run_eval(eval_config(model_dir, sets, out), method=method)
    assert method.started
    for name in ("eval_12", "eval_20"):
        lines = _lines(out / "samples" / f"{name}.jsonl")
        assert [line["row"] for line in lines] == [0, 1, 2, 3]
        assert [line["sub_em"] for line in lines] == [0.5, 1.0, 1.0, 0.0]
        assert [line["em"] for line in lines] == [0.5, 1.0, 0.0, 0.0]
        assert lines[2]["f1"] == pytest.approx(1 / 3)
        assert [r["pred"] for r in lines[0]["runs"]] == ["France", "Germany"]
        assert lines[3]["runs"][0]["pred"] is None
    column = summary["columns"][0]
    assert column["label"] == "12 docs" and column["samples"] == 4
    assert column["accuracy"] == column["sub_em"] == pytest.approx(62.5)
    assert column["em"] == pytest.approx(37.5)
    assert column["f1"] == pytest.approx(100 * (0.5 + 1 + 1 / 3 + 0) / 4)
    table = (out / "table.md").read_text().splitlines()
    assert table[0] == "| model | method | 12 docs | 20 docs |"
    assert table[2] == "| tiny-random | memagent | 62.50 | 62.50 |"
    saved = json.loads((out / "table.json").read_text())
    assert saved["columns"] == ["12 docs", "20 docs"] and len(saved["rows"]) == 1
    assert json.loads((out / "summary.json").read_text())["columns"][1]["label"] == "20 docs"


def test_published_rows_join_the_paper_lengths(model_dir, tmp_path):
    paths = []
    for n in (50, 100):  # the paper's 7K and 14K columns (tiny stand-in contexts)
        paths.append(str(tmp_path / f"eval_{n}.json"))
        write_set(paths[-1], [{"context": "Document 1:\nParis\nParis is in France.",
                               "input": "Where is Paris?", "answers": ["France"],
                               "num_docs": n, "index": i} for i in range(2)])
    out = tmp_path / "out"
    run_eval(eval_config(model_dir, paths, out),
             method=Scripted(lambda s, row, k: "\\boxed{France}" if row == 0 else "?"))
    table = (out / "table.md").read_text()
    assert "| model | method | 7K | 14K |" in table
    assert "| tiny-random | memagent | 50.00 | 50.00 |" in table
    assert "| RL-MemAgent-14B | paper | 83.59 | 82.03 |" in table
    assert "| Qwen2.5-7B-Instruct-1M | paper | 61.72 | 56.25 |" in table


def test_ruler_sets_use_string_match_all(model_dir, tmp_path):
    path = str(tmp_path / "eval_niah_multivalue_8192.json")
    write_set(path, [{"context": "...", "input": "What are all the special magic numbers?",
                      "answers": ["1234567", "7654321"], "task": "niah_multivalue",
                      "length": 8192, "tokens": 8190, "index": i} for i in range(2)])
    summary = run_eval(eval_config(model_dir, [path], tmp_path / "out"), method=Scripted(
        lambda s, row, k: "\\boxed{1234567, 7654321}" if row else "\\boxed{1234567 only}"))
    (column,) = summary["columns"]
    assert column["label"] == "8K" and summary["metric"] == "string_match_all"
    assert column["accuracy"] == column["string_match_all"] == pytest.approx(75.0)


def test_resume_after_a_crash_evaluates_every_sample_once(model_dir, sets, tmp_path):
    out = tmp_path / "out"
    crashing = Scripted(lambda s, row, k: REPLIES[row][k], fail_after=5)
    with pytest.raises(RuntimeError, match="injected crash"):
        run_eval(eval_config(model_dir, sets, out, "data.batch_size=2"), method=crashing)
    done = crashing.finished
    assert done == [("eval_12", r) for r in range(4)] + [("eval_20", 0)]
    # the crash also tore the line being written
    log = out / "samples" / "eval_20.jsonl"
    with open(log, "ab") as f:
        f.write(b'{"row": 1, "index": 1, "question": "Were Ada')
    rerun = Scripted(lambda s, row, k: REPLIES[row][k])
    summary = run_eval(eval_config(model_dir, sets, out, "data.batch_size=2"), method=rerun)
    assert rerun.finished == [("eval_20", r) for r in (1, 2, 3)]
    for name in ("eval_12", "eval_20"):
        assert [line["row"] for line in _lines(out / "samples" / f"{name}.jsonl")] == [0, 1, 2,
                                                                                      3]
    assert log.read_bytes().endswith(b"\n")
    assert [c["samples"] for c in summary["columns"]] == [4, 4]
    # a finished eval re-run does nothing, not even load the model
    idle = Scripted(lambda s, row, k: "")
    run_eval(eval_config(model_dir, sets, out), method=idle)
    assert idle.finished == [] and not idle.started


def test_ctrl_c_is_one_line_saying_what_is_kept(model_dir, sets, tmp_path, capsys,
                                               monkeypatch):
    out = tmp_path / "out"
    interrupted = Scripted(lambda s, row, k: REPLIES[row][k], fail_after=3,
                           crash=KeyboardInterrupt())
    monkeypatch.setattr("memagent_jax.eval.runner.make_method", lambda *a: interrupted)
    assert _cli(model_dir, sets, out) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"memagent-jax: interrupted; the 3 finished questions are kept in {out}: run the same "
        "command to resume")


def test_rerun_with_other_settings_is_refused(model_dir, sets, tmp_path):
    out = tmp_path / "out"
    run_eval(eval_config(model_dir, sets, out), method=Scripted(lambda s, row, k: ""))
    with pytest.raises(UserError, match="sampling.temperature was 0.7, now 1.0"):
        run_eval(eval_config(model_dir, sets, out, "sampling.temperature=1.0"),
                 method=Scripted(lambda s, row, k: ""))
    with pytest.raises(UserError) as e:  # every change named, not the first one alone
        run_eval(eval_config(model_dir, sets, out, "sampling.n=3", "memagent.chunk_tokens=32"),
                 method=Scripted(lambda s, row, k: ""))
    assert str(e.value) == (f"{out} holds results of a different run (memagent.chunk_tokens "
                            "was 64, now 32; sampling.n was 2, now 3); choose a new output_dir")
    # the same file name with other questions (a set rebuilt differently) is refused too
    records = json.loads(Path(sets[0]).read_text())
    records[2]["input"] = "Another question?"
    rebuilt = tmp_path / "rebuilt" / "eval_12.json"
    write_set(str(rebuilt), records)
    with pytest.raises(UserError, match="row 2 holds results for another question"):
        run_eval(eval_config(model_dir, [str(rebuilt)], out), method=Scripted(lambda s, r, k: ""))


def _error(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and lines[-1].startswith(PREFIX)
    return lines[-1]


def test_bad_config_and_sets(model_dir, sets, tmp_path, capsys):
    out = tmp_path / "out"
    assert _cli(model_dir, sets, out, "sampling.temprature=1") == 2
    assert "unknown key 'sampling.temprature'" in _error(capsys)
    assert _cli(model_dir, sets, out, "sampling.top_p=2") == 2
    assert "sampling.top_p: must be in (0, 1]" in _error(capsys)
    bad = tmp_path / "eval_bad.json"
    bad.write_text(json.dumps([{"context": "c", "input": "q", "answers": ["a"]},
                               {"context": "c", "input": "q"}]))
    assert _cli(model_dir, [str(bad)], out) == 2
    assert f"{bad}: row 1: missing field 'answers'" in _error(capsys)
    bad.write_text(json.dumps([{"context": "hello", "input": " ", "answers": ["a"]}]))
    assert _cli(model_dir, [str(bad)], out) == 2
    assert f"{bad}: row 0: the question is empty" in _error(capsys)
    assert _cli(model_dir, sets, bad) == 2
    assert f"output_dir: {bad} is a file, not a directory" in _error(capsys)
    assert _cli(model_dir, [str(tmp_path / "nope.json")], out) == 2
    assert "nope.json: evaluation set not found" in _error(capsys)
    ruler = tmp_path / "eval_vt.json"
    ruler.write_text(json.dumps([{"context": "c", "input": "q", "answers": ["A"],
                                  "task": "vt", "length": 10}]))
    assert _cli(model_dir, [sets[0], str(ruler)], out) == 2
    assert "data.sets mix tasks ruler_hqa, vt" in _error(capsys)
    not_a_model = tmp_path / "notes"
    not_a_model.mkdir()
    assert _cli(not_a_model, sets, out) == 2
    assert _error(capsys) == (f"{PREFIX}model.path: '{not_a_model}' is not a model directory "
                              "(no config.json, not a memagent-jax checkpoint)")
    train_config = str(Path(CONFIG).parents[1] / "train" / "tiny_cpu.yaml")
    assert main(["eval", "--config", train_config]) == 2
    assert _error(capsys) == (f"{PREFIX}{train_config}: a config for `memagent-jax train` (it "
                              "has 'rollout', 'dynamic_sampling', 'overlong', ...), not for "
                              "`memagent-jax eval`: run it with `memagent-jax train --config`")
    assert not out.exists()  # nothing written before the input is known good


def test_eval_says_what_it_is_about_to_do_and_logs_progress_as_lines(model_dir, sets, tmp_path,
                                                                    monkeypatch, capsys):
    """Before the model loads, one block on stderr; the progress bars on a stderr that is no
    terminal (here pytest's capture) are plain lines, not carriage-return redraws."""
    monkeypatch.setattr(runner, "make_method",
                        lambda config, tokenizer: Scripted(lambda s, row, k: REPLIES[row][k]))
    out = tmp_path / "out"
    assert _cli(model_dir, sets, out, "data.max_samples=3") == 0
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert lines[:7] == [
        "eval: tiny-random, memagent",
        f"  model     {model_dir}",
        "  data      2 set(s), 6 questions (6 left): eval_12, eval_20",
        "  devices   8 cpu device(s), mesh one device",
        "  budgets   chunks of 64 tokens, memory 8, final answer 8; 4 decode slots",
        "  sampling  2 answer(s) a question, temperature 0.7, top_p 0.95",
        f"  output    {out}"], lines
    assert [line.split("|")[0] for line in lines[7:]] == ["chunks: 100%", "samples: 100%"]


@pytest.mark.parametrize("plotted", [True, False])
def test_the_results_line_names_the_files_written(model_dir, sets, tmp_path, monkeypatch, capsys,
                                                  plotted):
    monkeypatch.setattr(runner, "make_method",
                        lambda config, tokenizer: Scripted(lambda s, row, k: REPLIES[row][k]))
    if not plotted:
        block_package(monkeypatch, "matplotlib")
    out = tmp_path / "out"
    assert _cli(model_dir, sets, out) == 0
    captured = capsys.readouterr()
    files = "summary.json, table.md, table.json" + ", accuracy.png" * plotted
    assert captured.out.splitlines()[-1] == f"results in {out} ({files}, samples/)"
    assert (out / "accuracy.png").exists() == plotted
    warning = ("memagent-jax: warning: no accuracy.png: the accuracy plot needs matplotlib, "
               "which is not installed: pip install 'memagent-jax[data]'")
    assert (warning in captured.err.splitlines()) != plotted, captured.err


def test_full_context_prompt_is_centre_truncated(model_dir, sets):
    config = eval_config(model_dir, sets, "unused", "method=full_context",
                     "full_context.max_input_tokens=40")
    tokenizer = load_tokenizer(model_dir)
    method = FullContextMethod(config, tokenizer)
    method.max_input = 40
    record = {"context": " ".join(["hello"] * 30 + ["memory"] * 30 + ["world"] * 30),
              "input": "what is the answer"}
    ids, context_tokens = method.prompt_ids(record)
    assert context_tokens == 90
    text = tokenizer.decode(ids)
    kept = text.split()
    # the first and last halves survive (the question and instruction are at the end), the
    # middle of the document is cut
    assert "hello" in kept and "memory" not in kept and "world" in kept
    assert "answer" in kept[len(kept) - kept[::-1].index("world"):]  # the question stays
    assert len(ids) <= 40 + method.overhead + 64
    short = {"context": "hello world", "input": "what is the answer"}
    full, _ = method.prompt_ids(short)
    assert "hello world" in tokenizer.decode(full)


def test_full_context_reads_thinking_off_and_names_it_in_the_identity(sets, tmp_path):
    """memagent.thinking: off reaches the baseline's one prompt too (the Qwen3-like template's
    empty think block at its end), and a run's identity names the setting only when it is not
    the default, so directories from before the setting resume under keep."""
    model_dir = write_tiny_model(tmp_path / "m", seed=3, thinking=True)
    tokenizer = load_tokenizer(model_dir)
    record = {"context": "hello world", "input": "what is the answer"}
    prompts, identities = {}, {}
    for thinking in ("keep", "off"):
        config = eval_config(model_dir, sets, "unused", "method=full_context",
                         f"memagent.thinking={thinking}")
        method = FullContextMethod(config, tokenizer)
        method.max_input = 40
        prompts[thinking] = method.prompt_ids(record)[0]
        identities[thinking] = config.identity()
    block = tokenizer.encode("<think> </think>", add_special_tokens=False)
    assert prompts["off"] == prompts["keep"] + block
    assert "memagent.thinking" not in identities["keep"]
    assert identities["off"] == dict(identities["keep"], **{"memagent.thinking": "off"})



def test_an_adapter_is_part_of_the_identity_and_no_server_takes_one(sets, tmp_path):
    """model.lora changes the weights, so a run resumed with another adapter (or none) is
    refused; a server serves its own weights, so model.url with model.lora is one error line."""
    model_dir = write_tiny_model(tmp_path / "m", seed=3)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    plain = eval_config(model_dir, sets, "unused").identity()
    with_adapter = eval_config(model_dir, sets, "unused", f"model.lora={adapter}").identity()
    assert with_adapter == dict(plain, **{"model.lora": str(adapter)})
    with pytest.raises(UserError, match="model.lora: the server at model.url"):
        eval_config(model_dir, sets, "unused", f"model.lora={adapter}",
                    "model.url=http://127.0.0.1:1/v1")

def _png_ok(path):
    from PIL import Image
    image = np.asarray(Image.open(path).convert("RGB"), dtype=np.int32)
    assert image.shape == (500, 800, 3)
    not_white = (image < 250).any(axis=-1).mean()
    assert 0.02 < not_white < 0.9 and len(np.unique(image.reshape(-1, 3), axis=0)) > 20


@pytest.mark.slow
def test_tiny_model_memagent_and_full_context(model_dir, sets, tmp_path, capsys):
    memagent, baseline = tmp_path / "memagent", tmp_path / "full"
    assert _cli(model_dir, sets, memagent) == 0
    err = capsys.readouterr().err
    assert "samples: 100%" in err and "chunks: 100%" in err
    tokenizer = load_tokenizer(model_dir)
    summary = json.loads((memagent / "summary.json").read_text())
    for path, column in zip(sets, summary["columns"]):
        lines = _lines(memagent / "samples" / f"{Path(path).stem}.jsonl")
        records = json.loads(Path(path).read_text())
        assert sorted(line["row"] for line in lines) == [0, 1, 2, 3]
        for line in lines:
            tokens = len(tokenizer(records[line["row"]]["context"],
                                   add_special_tokens=False)["input_ids"])
            assert line["context_tokens"] == tokens
            assert line["turns"] == math.ceil(tokens / 64) + 1
            assert len(line["runs"]) == 2
            assert all(r["response_tokens"] <= 8 for r in line["runs"])
        assert column["sub_em"] == pytest.approx(100 * np.mean([x["sub_em"] for x in lines]))
        assert column["tokens"] == pytest.approx(np.mean([x["context_tokens"] for x in lines]))
    _png_ok(memagent / "accuracy.png")

    assert _cli(model_dir, sets[:1], baseline, "method=full_context", "data.max_samples=2",
                f"report.compare=[{memagent}]") == 0
    lines = _lines(baseline / "samples" / "eval_12.jsonl")
    assert [line["turns"] for line in lines] == [1, 1]
    table = (baseline / "table.md").read_text().splitlines()
    assert table[0] == "| model | method | 12 docs | 20 docs |"
    assert table[2].startswith("| tiny-random | full_context |") and table[2].endswith("| - |")
    assert table[3].startswith("| tiny-random | memagent |")
    _png_ok(baseline / "accuracy.png")


@pytest.mark.slow
def test_eval_killed_midway_resumes(model_dir, sets, tmp_path):
    out = tmp_path / "out"
    args = ["eval", "--config", CONFIG, f"model.path={model_dir}",
            f"data.sets={json.dumps(sets)}", f"output_dir={out}", "data.batch_size=1"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen([sys.executable, "-m", "memagent_jax.cli", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = out / "samples" / "eval_12.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and log.read_bytes().count(b"\n") >= 2:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    assert proc.wait() == -signal.SIGKILL, "the eval finished (or failed) before the kill"
    before = {p.name: p.read_bytes().count(b"\n") for p in (out / "samples").iterdir()}
    assert 2 <= sum(before.values()) < 8
    assert main(args) == 0
    for path in sets:
        rows = [line["row"] for line in _lines(out / "samples" / f"{Path(path).stem}.jsonl")]
        assert sorted(rows) == [0, 1, 2, 3]  # each sample exactly once
    kept = _lines(log)[:before["eval_12.jsonl"]]
    assert [line["row"] for line in kept] == list(range(len(kept)))  # earlier lines untouched


def test_sets_without_a_context_plot_by_name_without_warnings(tmp_path):
    """An agent's sets have no context (0 tokens): points by set name, not a log axis that
    matplotlib cannot draw (it warned and left the points out)."""
    import warnings

    from memagent_jax.eval.report import plot
    columns = [{"set": name, "label": name, "tokens": 0.0, "accuracy": accuracy}
               for name, accuracy in (("eval_lookup", 100.0), ("eval_other", 40.0))]
    summary = {"model": "m", "method": "agent", "task": "lookup", "metric": "em",
               "columns": columns}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot(str(tmp_path / "accuracy.png"), [summary], published=False)
    _png_ok(tmp_path / "accuracy.png")


def test_a_set_not_made_yet_points_at_the_commands_in_the_configs_header(tmp_path, capsys):
    """The shipped configs' headers give the `memagent-jax data` commands that make their sets
    (the error said only "not found"); a config without them gets the plain line."""
    shipped = str(Path(__file__).resolve().parents[2] / "configs" / "eval" / "tiny_cpu.yaml")
    missing = tmp_path / "sets" / "eval_12.json"
    assert main(["eval", "--config", shipped, f"data.sets=[{missing}]"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"memagent-jax: error: {missing}: evaluation set not found; make it with the commands "
        f"in the header of {shipped}"]
    own = tmp_path / "own.yaml"
    own.write_text("# my eval\nmodel:" + Path(shipped).read_text().split("\nmodel:", 1)[1])
    assert main(["eval", "--config", str(own), f"data.sets=[{missing}]"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"memagent-jax: error: {missing}: evaluation set not found"]


@pytest.mark.parametrize("method", [[], ["method=agent",
                                         "agent={module: memagent_jax.agents.single_turn}"]])
def test_a_server_is_asked_as_the_sampling_section_says(model_dir, sets, tmp_path, method):
    """Both methods a server runs (model.url) sample every call with the config's
    temperature, top_p and top_k, under its served name."""
    config = eval_config(model_dir, sets, tmp_path / "out", "model.url=http://127.0.0.1:9/v1",
                         "model.served_name=m", "sampling.temperature=0.5",
                         "sampling.top_p=0.9", "sampling.top_k=7", *method)
    chosen = runner.make_method(config, load_tokenizer(model_dir))
    chosen.start()
    server = chosen.server
    assert (server.url, server.model) == ("http://127.0.0.1:9/v1", "m")
    assert (server.temperature, server.top_p, server.top_k) == (0.5, 0.9, 7)
