"""`memagent-jax eval-compare`: two models' eval results on the same documents, paired.

For every set (one context length) of two finished eval output directories: the documents
each model answers right, with Wilson 95 % score intervals, the discordant pairs (right for one
model, wrong for the other) and the exact two-sided sign test on them (the exact McNemar test).
Exact match is the headline (or sub-EM: `--metric`), the other beside it (docs/algorithm.md
section 2, "Comparing two models").
Given one directory, each set's counts and intervals alone.

Samples are paired by their row in the set file; the two runs must have read the same
documents (the same sets, the same number of samples, and row by row the same index, question
and gold answers), else the comparison is refused. Only evals with one answer per question
(`sampling.n: 1`) are compared: with several, a question's score is a mean, not right or wrong.
"""

from __future__ import annotations

import dataclasses
import math
import os

from memagent_jax.errors import UserError
from memagent_jax.eval.results import read_results, read_summary
from memagent_jax.fileutil import atomic_file

Z95 = 1.959963984540054    # the standard normal's 97.5 % quantile: a two-sided 95 % interval
METRICS = {"em": "EM", "sub_em": "sub-EM"}
_IDENTITY = ("index", "question", "answers")  # what makes two runs' row the same document


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a proportion, k successes of n trials:

        centre = (k + z^2 / 2) / (n + z^2)
        half   = z / (n + z^2) * sqrt(k (n - k) / n + z^2 / 4)
        (centre - half, centre + half)

    (the values of p whose score test |k/n - p| / sqrt(p (1 - p) / n) <= z). Unlike the
    normal approximation it stays inside [0, 1] and is not empty at k = 0 or k = n, where its
    lower (upper) end is exactly 0 (1): returned so, not as a rounding's -1e-17."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"expected 0 <= k <= n and n > 0, got k={k}, n={n}")
    z2 = z * z
    centre = (k + z2 / 2) / (n + z2)
    half = z / (n + z2) * math.sqrt(k * (n - k) / n + z2 / 4)
    low = 0.0 if k == 0 else max(0.0, centre - half)
    high = 1.0 if k == n else min(1.0, centre + half)
    return low, high


def sign_test(a_only: int, b_only: int) -> float:
    """The exact two-sided sign test of the discordant pairs (the exact McNemar test): with
    d = a_only + b_only and m = min(a_only, b_only), under "neither model is better" the count
    a_only is binomial(d, 1/2), and

        p = min(1, 2 * sum_{i=0}^{m} C(d, i) / 2^d)

    (twice the smaller tail; 1 when there are no discordant pairs). Computed in integers, one
    rounding at the end."""
    if a_only < 0 or b_only < 0:
        raise ValueError(f"expected counts >= 0, got {a_only}, {b_only}")
    d = a_only + b_only
    if d == 0:
        return 1.0
    tail = sum(math.comb(d, i) for i in range(min(a_only, b_only) + 1))
    return min(1.0, 2 * tail / 2 ** d)


@dataclasses.dataclass
class RunSet:
    name: str             # the set file's stem (samples/<name>.jsonl)
    label: str            # the table column of `eval`: "8K", "1M", ...
    records: list[dict]   # row 0, 1, ... of the set


@dataclasses.dataclass
class Run:
    path: str
    model: str
    sets: list[RunSet]    # by context length, as the eval's summary orders them


def read_run(path: str, metrics: tuple[str, ...] = tuple(METRICS)) -> Run:
    """A finished eval output directory's per-sample results, checked: one answer per
    question, every sample of every set present, each of `metrics` right (1) or wrong (0)."""
    summary = read_summary(path)
    if summary.get("n", 1) != 1:
        raise UserError(f"{path}: {summary['n']} answers per question (sampling.n); "
                        "eval-compare pairs right/wrong answers: evaluate with sampling.n=1")
    sets = []
    for column in summary["columns"]:
        name, count = column["set"], column["samples"]
        log = os.path.join(path, "samples", f"{name}.jsonl")
        if not os.path.isfile(log):
            raise UserError(f"{path}: set {name}: {log} not found")
        lines = read_results(log)
        missing = [row for row in range(count) if row not in lines]
        if missing:
            raise UserError(f"{path}: set {name}: no result for row {missing[0]}")
        records = [lines[row] for row in range(count)]  # rows past max_samples are not counted
        for record in records:
            if len(record["runs"]) != 1:
                raise UserError(f"{path}: set {name}: row {record['row']} has "
                                f"{len(record['runs'])} answers; eval-compare pairs right/wrong "
                                "answers: evaluate with sampling.n=1")
            for metric in metrics:
                if metric not in record:
                    raise UserError(f"{path}: set {name}: no '{metric}' per sample (not a QA "
                                    "eval); eval-compare compares exact and sub-exact match")
                if record[metric] not in (0, 1):
                    raise UserError(f"{path}: set {name}: row {record['row']}: {metric} is "
                                    f"{record[metric]}, expected 0 or 1")
        sets.append(RunSet(name, column["label"], records))
    return Run(path, summary["model"], sets)


def check_paired(a: Run, b: Run) -> None:
    """Refuses (UserError naming the set) unless the two runs read the same documents."""
    names_a, names_b = [s.name for s in a.sets], [s.name for s in b.sets]
    for name in names_a + names_b:
        if name not in names_a or name not in names_b:
            only, other = (a, b) if name in names_a else (b, a)
            raise UserError(f"set {name}: in {only.path} only, not in {other.path}")
    b_sets = {s.name: s for s in b.sets}
    for set_a in a.sets:
        set_b = b_sets[set_a.name]
        if len(set_a.records) != len(set_b.records):
            raise UserError(f"set {set_a.name}: {len(set_a.records)} samples in {a.path}, "
                            f"{len(set_b.records)} in {b.path}; not the same documents")
        for ra, rb in zip(set_a.records, set_b.records):
            for key in _IDENTITY:
                if ra.get(key) != rb.get(key):
                    raise UserError(f"set {set_a.name}: row {ra['row']}: not the same {key} "
                                    f"in {a.path} and {b.path}; not the same documents")


def _right(records: list[dict], metric: str) -> list[bool]:
    return [record[metric] == 1 for record in records]


def compare(a: Run, b: Run, headline: str = "em") -> list[dict]:
    """Per set and metric (the headline first, then the other): {"set", "label", "metric",
    "n", "a_right", "b_right", "a_interval", "b_interval", "a_only", "b_only", "p"}."""
    check_paired(a, b)
    b_sets = {s.name: s for s in b.sets}
    rows = []
    for set_a in a.sets:
        set_b = b_sets[set_a.name]
        for metric in _ordered(headline):
            right_a, right_b = _right(set_a.records, metric), _right(set_b.records, metric)
            n = len(right_a)
            a_only = sum(x and not y for x, y in zip(right_a, right_b))
            b_only = sum(y and not x for x, y in zip(right_a, right_b))
            rows.append({"set": set_a.name, "label": set_a.label, "metric": metric, "n": n,
                         "a_right": sum(right_a), "b_right": sum(right_b),
                         "a_interval": wilson_interval(sum(right_a), n),
                         "b_interval": wilson_interval(sum(right_b), n),
                         "a_only": a_only, "b_only": b_only, "p": sign_test(a_only, b_only)})
    return rows


def _ordered(headline: str) -> list[str]:
    return [headline] + [m for m in METRICS if m != headline]


def _labels(sets: list[RunSet]) -> dict[str, str]:
    """A set's name in the table: its length label, or its file name where labels repeat."""
    labels = [s.label for s in sets]
    return {s.name: s.label if labels.count(s.label) == 1 else s.name for s in sets}


def _count(k: int, n: int) -> str:
    low, high = wilson_interval(k, n)
    return f"{k} ({100 * k / n:.1f} %, {100 * low:.1f}-{100 * high:.1f})"


def _names(a: Run, b: Run) -> tuple[str, str]:
    if a.model != b.model:
        return a.model, b.model
    return f"{a.model} (A)", f"{b.model} (B)"


def paired_markdown(a: Run, b: Run, headline: str = "em") -> str:
    """The table a researcher pastes: a row per set and metric, and the legend under it."""
    rows = compare(a, b, headline)
    name_a, name_b = _names(a, b)
    labels = _labels(a.sets)
    lines = [f"| length | metric | n | {name_a} right | {name_b} right | {name_a} only | "
             f"{name_b} only | p |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {labels[r['set']]} | {METRICS[r['metric']]} | {r['n']} | "
                     f"{_count(r['a_right'], r['n'])} | {_count(r['b_right'], r['n'])} | "
                     f"{r['a_only']} | {r['b_only']} | {r['p']:.3g} |")
    lines += ["", f"{name_a}: {a.path}; {name_b}: {b.path}. right: documents answered right "
              "(%, Wilson 95 % interval); only: right for one model and wrong for the other, "
              "on the same document; p: exact two-sided sign test on those (McNemar)."]
    return "\n".join(lines) + "\n"


def single_markdown(a: Run, headline: str = "em") -> str:
    """One model: per set, each metric's count right with its Wilson 95 % interval."""
    metrics = _ordered(headline)
    labels = _labels(a.sets)
    lines = ["| length | n | " + " | ".join(f"{METRICS[m]} right" for m in metrics) + " |",
             "|---|---|" + "---|" * len(metrics)]
    for s in a.sets:
        n = len(s.records)
        cells = [_count(sum(_right(s.records, m)), n) for m in metrics]
        lines.append(f"| {labels[s.name]} | {n} | " + " | ".join(cells) + " |")
    lines += ["", f"{a.model}: {a.path}. right: documents answered right (%, Wilson 95 % "
              "interval)."]
    return "\n".join(lines) + "\n"


def main(dirs: list[str], headline: str = "em", out: str | None = None) -> str:
    """The CLI entry: reads one or two output directories, returns (and writes to `out`) the
    Markdown."""
    runs = [read_run(d) for d in dirs]
    text = (paired_markdown(runs[0], runs[1], headline) if len(runs) == 2
            else single_markdown(runs[0], headline))
    if out:
        with atomic_file(out) as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    return text
