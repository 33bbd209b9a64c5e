"""The RL-only ladder's committed results (docs/synthetic.md, "RL on the outcome reward from a
format-only start"): its start and end, and the honest ladder's start, as Hugging Face exports
that `transformers` loads with our logits, recording the budgets its test config reads them
with; and the test table docs/results.md and docs/synthetic.md quote, recomputed from the
committed per-document answers."""

import dataclasses
import os

import pytest

from memagent_jax import model_dir
from memagent_jax.eval.compare import compare, read_run, wilson_interval
from memagent_jax.eval.config import EvalConfig
from memagent_jax.runconfig import load_config
from tests.hf_reference import assert_trained_export_matches_transformers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "results", "rl_only_test")


@pytest.mark.parametrize("name, test", [("start", "rl_only_test"), ("final", "rl_only_test"),
                                        ("honest_start", "rl_only_honest_test")])
def test_the_exports_load_in_transformers_with_our_logits_and_the_test_budgets(name, test):
    path = os.path.join(ROOT, "checkpoints", "rl_only", name)
    assert_trained_export_matches_transformers(path)
    test_config = load_config(EvalConfig, os.path.join(ROOT, "configs", "eval", f"{test}.yaml"))
    budgets = dataclasses.asdict(test_config.memagent)
    assert {k: budgets[k] for k in model_dir.budgets(path)} == model_dir.budgets(path)


def _count(k: int, n: int) -> str:
    low, high = wilson_interval(k, n)
    return f"{k} ({100 * k / n:.1f} %, {100 * low:.1f}-{100 * high:.1f})"


def test_the_quoted_test_table_is_the_committed_answers():
    final, start, tiny = (read_run(os.path.join(RESULTS, m)) for m in ("final", "start", "tiny"))
    against_start = [r for r in compare(final, start) if r["metric"] == "em"]
    against_tiny = [r for r in compare(final, tiny) if r["metric"] == "em"]  # same documents
    assert [r["label"] for r in against_start] == ["8K", "64K", "1M"]
    with open(os.path.join(ROOT, "docs", "results.md"), encoding="utf-8") as f:
        results_md = f.read()
    with open(os.path.join(ROOT, "docs", "synthetic.md"), encoding="utf-8") as f:
        synthetic_md = f.read()
    for row, beside in zip(against_start, against_tiny):
        n, p = row["n"], f"{row['p']:.2g}"
        start_count, end_count = _count(row["b_right"], n), _count(row["a_right"], n)
        tiny_count = _count(beside["b_right"], n)
        assert (f"| {row['label']} | {start_count} | {end_count} | {p} | {tiny_count} |"
                in results_md), row
        assert (f"| {row['label']} | {start_count} | {end_count} | {row['a_only']} / "
                f"{row['b_only']} | {p} | {tiny_count} |" in synthetic_md), row
