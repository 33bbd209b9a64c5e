"""Results as the paper shows them: a table (rows = model/method, columns = context lengths) in
Markdown and JSON, and a PNG of accuracy against context length (log-scale x), optionally with
the published RULER-HQA curves of docs/algorithm.md section 5 for comparison.

Input: run summaries (`summary.json` of an eval output dir), each
{"model", "method", "task", "metric", "columns": [{"label", "tokens", "accuracy", ...}]}.
"""

from __future__ import annotations

import json
import os
import sys

from memagent_jax.errors import UserError
from memagent_jax.eval.results import read_summary
from memagent_jax.extras import MissingExtra, needs
from memagent_jax.fileutil import atomic_file

# docs/algorithm.md section 5: RULER-HQA accuracy (%, mean sub-EM x 100) at these lengths.
PUBLISHED_LABELS = ("7K", "14K", "28K", "56K", "112K", "224K", "448K", "896K", "1.75M", "3.5M")
PUBLISHED_TOKENS = (7e3, 14e3, 28e3, 56e3, 112e3, 224e3, 448e3, 896e3, 1.75e6, 3.5e6)
PUBLISHED_RULER_HQA = {
    "RL-MemAgent-14B": (83.59, 82.03, 84.38, 80.47, 76.56, 81.25, 75.00, 77.34, 76.56, 78.12),
    "RL-MemAgent-7B": (82.03, 79.69, 78.91, 77.34, 79.69, 72.66, 74.22, 76.56, 75.78, 71.09),
    "QwenLong-L1-32B": (72.66, 75.00, 72.66, 60.94, 31.25, 17.19, 13.28, 11.72, None, None),
    "Qwen2.5-14B-Instruct-1M": (60.16, 60.94, 50.00, 57.03, 50.00, 37.50, 8.59, 0.00, None,
                                None),
    "Qwen2.5-7B-Instruct-1M": (61.72, 56.25, 53.91, 55.47, 51.56, 33.59, 12.50, 0.00, None,
                               None),
}
_METRIC_NAMES = {"sub_em": "accuracy (sub-EM, %)", "string_match_all": "string_match_all (%)"}


def _published_rows(labels: list[str]) -> list[dict]:
    return [{"model": name, "method": "paper",
             "values": {label: dict(zip(PUBLISHED_LABELS, values)).get(label)
                        for label in labels}}
            for name, values in PUBLISHED_RULER_HQA.items()]


def build_table(summaries: list[dict], published: bool) -> dict:
    """{"task", "metric", "columns": [labels by length], "rows": [{"model", "method",
    "values": {label: accuracy or None}}]}; published rows only where a column is one of
    the paper's lengths."""
    task, metric = summaries[0]["task"], summaries[0]["metric"]
    for s in summaries[1:]:
        if s["task"] != task:
            raise UserError(f"report.compare: {s['model']} ({s['method']}) is a {s['task']} "
                            f"eval, this one is {task}")
    lengths: dict[str, float] = {}
    for s in summaries:
        for column in s["columns"]:
            lengths.setdefault(column["label"], column.get("nominal_tokens") or column["tokens"])
    labels = sorted(lengths, key=lengths.__getitem__)
    rows = [{"model": s["model"], "method": s["method"],
             "values": {label: next((c["accuracy"] for c in s["columns"]
                                     if c["label"] == label), None) for label in labels}}
            for s in summaries]
    if published and task == "ruler_hqa" and set(labels) & set(PUBLISHED_LABELS):
        rows += _published_rows(labels)
    return {"task": task, "metric": metric, "columns": labels, "rows": rows}


def markdown(table: dict) -> str:
    header = ["model", "method", *table["columns"]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table["rows"]:
        cells = [f"{v:.2f}" if v is not None else "-" for v in row["values"].values()]
        lines.append("| " + " | ".join([row["model"], row["method"], *cells]) + " |")
    return "\n".join(lines) + "\n"


def _length_text(tokens: float, _=None) -> str:
    for size, unit in ((1e6, "M"), (1e3, "K")):
        if tokens >= size:
            return f"{tokens / size:.3g}{unit}"
    return f"{tokens:.3g}"


def plot(path: str, summaries: list[dict], published: bool) -> None:
    """accuracy vs context length (tokens, log x), 800x500 pixels. Our points sit at the mean
    measured context length of each set; the paper's at its nominal lengths. Sets without a
    context (an agent's rows: 0 tokens) are points by name instead."""
    with needs("data", "the accuracy plot"):
        import matplotlib
        matplotlib.use("Agg")  # files only; no display
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    by_length = all(c["tokens"] > 0 for s in summaries for c in s["columns"])
    labels = sorted({c["label"] for s in summaries for c in s["columns"]})
    for s in summaries:
        columns = sorted(s["columns"], key=lambda c: c["tokens"])
        xs = ([c["tokens"] for c in columns] if by_length
              else [labels.index(c["label"]) for c in columns])
        ax.plot(xs, [c["accuracy"] for c in columns], marker="o",
                linewidth=2, label=f"{s['model']} ({s['method']})")
    if published and summaries[0]["task"] == "ruler_hqa":
        for name, values in PUBLISHED_RULER_HQA.items():
            points = [(x, v) for x, v in zip(PUBLISHED_TOKENS, values) if v is not None]
            ax.plot(*zip(*points), linestyle="--", marker=".", alpha=0.6,
                    label=f"{name} (paper)")
    if by_length:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(_length_text))
        ax.set_xlabel("context length (tokens)")
    else:
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel("set")
    ax.set_ylabel(_METRIC_NAMES.get(summaries[0]["metric"], summaries[0]["metric"]))
    ax.set_ylim(-2, 102)
    task = summaries[0]["task"]
    ax.set_title(f"{'RULER-HQA' if task == 'ruler_hqa' else task}: accuracy "
                 f"{'vs context length' if by_length else 'by set'}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)


def write_report(out_dir: str, summary: dict, compare: list[str], published: bool
                 ) -> tuple[dict, list[str]]:
    """Writes summary.json (this run's row), table.md, table.json and accuracy.png (unless
    matplotlib is missing: a warning instead) into out_dir; returns the table and the names of
    the files written."""
    _write_text(os.path.join(out_dir, "summary.json"), json.dumps(summary, indent=2) + "\n")
    summaries = [summary] + [read_summary(d, "report.compare: ") for d in compare]
    table = build_table(summaries, published)
    _write_text(os.path.join(out_dir, "table.md"), markdown(table))
    _write_text(os.path.join(out_dir, "table.json"), json.dumps(table, indent=2) + "\n")
    written = ["summary.json", "table.md", "table.json"]
    try:
        plot(os.path.join(out_dir, "accuracy.png"), summaries, published)
        written.append("accuracy.png")
    except MissingExtra as e:  # GPU images may lack matplotlib; hours of results still count
        print(f"memagent-jax: warning: no accuracy.png: {e}", file=sys.stderr)
    return table, written


def _write_text(path: str, text: str) -> None:
    with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
