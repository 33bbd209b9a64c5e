"""`memagent-jax eval-compare`: Wilson intervals and the exact sign test (against scipy where it
is installed, and by hand), and the paired table of two real eval output directories (the
runner with scripted answers), with its refusals."""

import json
import math
import shutil
import subprocess
import sys

import pytest

from memagent_jax.cli import main
from memagent_jax.data.io import write_set
from memagent_jax.eval.compare import Z95, sign_test, wilson_interval
from memagent_jax.eval.runner import run_eval
from tests.builders import Scripted, eval_config

PREFIX = "memagent-jax: error: "
N_GRID = [1, 2, 3, 5, 8, 12, 16, 32, 63, 64, 100, 128, 257, 1000]


# --- the statistics -------------------------------------------------------------------------

def test_wilson_interval_by_hand():
    # 5 of 10: centre 1/2, half-width z / (10 + z^2) * sqrt(10/4 + z^2/4)
    half = Z95 / (10 + Z95 ** 2) * math.sqrt(2.5 + Z95 ** 2 / 4)
    assert wilson_interval(5, 10) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-15)
    assert wilson_interval(5, 10) == pytest.approx((0.236593, 0.763407), abs=1e-6)
    # the figures docs/synthetic.md quotes: 57 of 64 -> 79-95 %, 118 of 128 -> 86-96 %
    assert [round(100 * x) for x in wilson_interval(57, 64)] == [79, 95]
    assert [round(100 * x) for x in wilson_interval(118, 128)] == [86, 96]
    low, high = wilson_interval(0, 1)
    assert low == 0.0 and high == pytest.approx(Z95 ** 2 / (1 + Z95 ** 2))
    low, high = wilson_interval(12, 12)
    assert high == 1.0 and low == pytest.approx(12 / (12 + Z95 ** 2))
    assert pytest.approx(1.959964, abs=1e-6) == Z95
    for n in range(1, 300):  # the ends are exact: never 1e-17 below 0 (printed "-0.0 %")
        assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0
    for bad in ((1, 0), (-1, 4), (5, 4)):
        with pytest.raises(ValueError):
            wilson_interval(*bad)


def test_sign_test_by_hand():
    assert sign_test(0, 0) == 1.0                       # no discordant pairs
    assert sign_test(8, 1) == 2 * (1 + 9) / 2 ** 9     # 0.039: docs' "p = 0.04" (04 -> 05)
    assert sign_test(1, 10) == 2 * (1 + 11) / 2 ** 11  # 0.012 (04 -> 06)
    assert sign_test(5, 0) == sign_test(0, 5) == 2 / 32
    assert sign_test(3, 3) == 1.0 and sign_test(2, 3) == 1.0  # twice the tail, capped at 1
    assert sign_test(1, 0) == 1.0
    assert sign_test(1000, 0) == 2.0 ** -999            # in integers: no overflow of 2^1000
    with pytest.raises(ValueError):
        sign_test(-1, 2)


def test_wilson_interval_equals_scipy():
    stats = pytest.importorskip("scipy.stats")
    for n in N_GRID:
        for k in sorted({0, 1, n // 3, n // 2, n - 1, n} | set(range(0, n + 1, max(1, n // 17)))):
            if not 0 <= k <= n:
                continue
            ci = stats.binomtest(k, n).proportion_ci(method="wilson")
            assert wilson_interval(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12), (k, n)


def test_sign_test_equals_scipy():
    stats = pytest.importorskip("scipy.stats")
    pairs = [(a, b) for a in range(0, 31) for b in range(0, 31) if a + b]
    pairs += [(70, 50), (50, 70), (500, 440), (3, 200)]
    for a, b in pairs:
        expected = stats.binomtest(a, a + b, 0.5).pvalue
        assert sign_test(a, b) == pytest.approx(expected, rel=1e-9, abs=1e-300), (a, b)


# --- two real eval output directories --------------------------------------------------------

# Per set, per row: R the right word, P a prefix of it (sub-EM 1, EM 0), W another word.
OUTCOMES = {"eval_multikey_8192": {"A": "RRRRRRRRRRRW", "B": "RRRRRPPPWWWR"},
            "eval_multikey_65536": {"A": "RRRRRRRRRRRR", "B": "PPPPPPWWWWWW"}}


def _reply(model):
    def reply(set_name, row, k):
        word = f"zukevu{row}"
        outcome = OUTCOMES[set_name][model][row]
        return "\\boxed{" + {"R": word, "P": word[:4], "W": "tumoba"}[outcome] + "}"
    return reply


def _write_sets(root, question="what is the code of KEY{i} ?"):
    root.mkdir()
    paths = []
    for length in (8192, 65536):
        paths.append(str(root / f"eval_multikey_{length}.json"))
        write_set(paths[-1], [{"context": "the code of KEY zukevu .", "input":
                               question.format(i=i), "answers": [f"zukevu{i}"],
                               "length": length, "synthetic_task": "multikey", "index": i}
                              for i in range(12)])
    return paths


@pytest.fixture(scope="module")
def runs(model_dir, tmp_path_factory):
    """Output dirs of two scripted models on the same 2 x 12 documents, and of runs that must
    not be paired with them."""
    root = tmp_path_factory.mktemp("compare")
    sets = _write_sets(root / "sets")
    other_sets = _write_sets(root / "other", question="which code has KEY{i} ?")
    greedy = ("sampling.n=1", "sampling.temperature=0")

    def run(name, model_name, paths, *overrides, reply=_reply("A"), n=1):
        out = root / name
        run_eval(eval_config(model_dir, paths, out, f"model.name={model_name}", *greedy,
                             *overrides), method=Scripted(reply, n=n))
        return str(out)

    return {"A": run("a", "dapo", sets), "B": run("b", "sft", sets, reply=_reply("B")),
            "fewer": run("fewer", "sft", sets, "data.max_samples=8"),
            "other": run("other", "sft", other_sets),
            "one_set": run("one_set", "sft", sets[:1]),
            "n2": run("n2", "sft", sets, "sampling.n=2", n=2), "root": str(root)}


@pytest.mark.slow
def test_paired_table(runs, capsys, tmp_path):
    out = tmp_path / "table.md"
    assert main(["eval-compare", runs["A"], runs["B"], "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == printed
    lines = printed.splitlines()
    assert lines[:2] == ["| length | metric | n | dapo right | sft right | dapo only | sft only "
                         "| p |", "|---|---|---|---|---|---|---|---|"]
    assert lines[2:6] == [
        # EM: 11 vs 6; A alone right on rows 5-10, B alone on row 11: p = 2 (1 + 7) / 2^7
        "| 8K | EM | 12 | 11 (91.7 %, 64.6-98.5) | 6 (50.0 %, 25.4-74.6) | 6 | 1 | 0.125 |",
        # sub-EM: B's prefixes (rows 5-7) count; A alone on rows 8-10: p = 2 (1 + 4) / 2^4
        "| 8K | sub-EM | 12 | 11 (91.7 %, 64.6-98.5) | 9 (75.0 %, 46.8-91.1) | 3 | 1 | 0.625 |",
        "| 64K | EM | 12 | 12 (100.0 %, 75.8-100.0) | 0 (0.0 %, 0.0-24.2) | 12 | 0 "
        "| 0.000488 |",
        "| 64K | sub-EM | 12 | 12 (100.0 %, 75.8-100.0) | 6 (50.0 %, 25.4-74.6) | 6 | 0 "
        "| 0.0312 |"]
    assert lines[6] == "" and lines[7].startswith(f"dapo: {runs['A']}; sft: {runs['B']}.")
    assert len(lines) == 8

    # sub-EM as the headline: its rows first; B against A: the columns swap
    assert main(["eval-compare", runs["B"], runs["A"], "--metric", "sub_em"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == ("| 8K | sub-EM | 12 | 9 (75.0 %, 46.8-91.1) | 11 (91.7 %, 64.6-98.5) "
                        "| 1 | 3 | 0.625 |")
    assert lines[3].startswith("| 8K | EM | 12 | 6 (50.0 %")


def test_an_existing_out_is_refused_not_overwritten(runs, capsys, tmp_path):
    out = tmp_path / "table.md"
    out.write_text("kept")
    assert main(["eval-compare", runs["A"], runs["B"], "--out", str(out)]) == 2
    assert capsys.readouterr() == ("", f"memagent-jax: error: --out: {out} exists; remove it "
                                       "or choose another --out\n")
    assert out.read_text() == "kept"


def test_one_directory_counts_and_intervals(runs, capsys):
    assert main(["eval-compare", runs["B"]]) == 0
    assert capsys.readouterr().out.splitlines()[:4] == [
        "| length | n | EM right | sub-EM right |", "|---|---|---|---|",
        "| 8K | 12 | 6 (50.0 %, 25.4-74.6) | 9 (75.0 %, 46.8-91.1) |",
        "| 64K | 12 | 0 (0.0 %, 0.0-24.2) | 6 (50.0 %, 25.4-74.6) |"]


def test_the_same_model_twice_is_named_a_and_b(runs, capsys):
    assert main(["eval-compare", runs["B"], runs["B"]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "sft (A) right | sft (B) right" in lines[0]
    assert lines[2].endswith("| 0 | 0 | 1 |")


@pytest.mark.parametrize("other, message", [
    ("fewer", "set eval_multikey_8192: 12 samples in {A}, 8 in {other}; not the same "
              "documents"),
    ("other", "set eval_multikey_8192: row 0: not the same question in {A} and {other}; not "
              "the same documents"),
    ("one_set", "set eval_multikey_65536: in {A} only, not in {other}"),
    ("n2", "{other}: 2 answers per question (sampling.n); eval-compare pairs right/wrong "
           "answers: evaluate with sampling.n=1"),
])
def test_refusals_are_one_line_naming_the_set(runs, capsys, other, message):
    assert main(["eval-compare", runs["A"], runs[other]]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == PREFIX + message.format(A=runs["A"], other=runs[other]) + "\n"


def test_refusals_of_what_is_not_a_finished_eval(runs, capsys, tmp_path):
    missing = str(tmp_path / "nothing")
    assert main(["eval-compare", runs["A"], missing]) == 2
    assert capsys.readouterr().err == (f"{PREFIX}{missing}: no summary.json (not a finished "
                                       "eval output directory)\n")
    assert main(["eval-compare", runs["A"], runs["B"], runs["A"]]) == 2
    assert "one or two output directories, got 3" in capsys.readouterr().err
    # another answer swapped in for one document's: the gold answers differ
    log = tmp_path / "b"
    shutil.copytree(runs["B"], log)
    samples = log / "samples" / "eval_multikey_65536.jsonl"
    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    lines[4]["answers"] = ["kinibi"]
    samples.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["eval-compare", runs["A"], str(log)]) == 2
    assert capsys.readouterr().err == (
        f"{PREFIX}set eval_multikey_65536: row 4: not the same answers in {runs['A']} and "
        f"{log}; not the same documents\n")
    samples.write_text(samples.read_text()[:-20])  # an eval interrupted mid-line
    assert main(["eval-compare", str(log)]) == 2
    assert "its last line is torn" in capsys.readouterr().err


def _rewrite_samples(run, to, edit):
    """A copy of the eval output directory `run` at `to`, every samples file's list of
    records replaced by edit(records); returns its path."""
    shutil.copytree(run, to)
    for samples in (to / "samples").glob("*.jsonl"):
        records = [json.loads(line) for line in samples.read_text().splitlines()]
        samples.write_text("".join(json.dumps(r) + "\n" for r in edit(records)))
    return str(to)


def test_records_pair_by_row_whatever_order_the_files_list_them(runs, capsys, tmp_path):
    """An eval appends each row's record as it finishes, so two runs' files list the
    documents in different orders: the records are paired by their row, and the table is
    that of the files in row order."""
    assert main(["eval-compare", runs["A"], runs["B"]]) == 0
    want = capsys.readouterr().out.splitlines()[:6]
    a = _rewrite_samples(runs["A"], tmp_path / "a", lambda r: r[5:] + r[:5])
    b = _rewrite_samples(runs["B"], tmp_path / "b", lambda r: r[::-1])
    assert main(["eval-compare", a, b]) == 0
    assert capsys.readouterr().out.splitlines()[:6] == want


def test_records_of_a_row_with_another_index_are_refused(runs, capsys, tmp_path):
    """A row must hold the same document's index in both runs."""
    def renumber(records):
        return [dict(r, index=r["index"] + 100) if r["row"] == 4 else r for r in records]
    b = _rewrite_samples(runs["B"], tmp_path / "b", renumber)
    assert main(["eval-compare", runs["A"], b]) == 2
    assert capsys.readouterr().err == (
        f"{PREFIX}set eval_multikey_8192: row 4: not the same index in {runs['A']} and {b}; "
        "not the same documents\n")


def test_the_command_imports_the_standard_library_only():
    code = ("import sys, memagent_jax.cli, memagent_jax.eval.compare; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'numpy', 'yaml', "
            "'scipy', 'tqdm'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"
