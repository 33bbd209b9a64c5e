"""Evaluation sets as the runner sees them: checked records, a column label, a metric.

A set file holds one context length of one task: RULER-HQA records {context, input, answers,
num_docs, index}, RULER synthetic records {context, input, answers, task, length, ...}, or QA
records of one `length` (`memagent-jax data synthetic`); `context` is optional (`method:
agent`'s rows may have none; MemAgent's check refuses a record without one).
QA sets are scored with EM / sub-EM / F1 (accuracy = sub-EM, as the paper); RULER synthetic
tasks with string_match_all (docs/algorithm.md section 2).
"""

from __future__ import annotations

import dataclasses
import os

from memagent_jax.data import hotpotqa, ruler
from memagent_jax.data.io import read_set
from memagent_jax.errors import UserError
from memagent_jax.eval.metrics import qa_scores, string_match_all


@dataclasses.dataclass
class EvalSet:
    """records[row] is sample `row` of the file (the key results are stored under)."""
    path: str
    name: str            # the file's stem: names its results file
    task: str            # "ruler_hqa", "qa" or a RULER task name
    label: str           # the table column: "7K", "8K", "12 docs", ...
    nominal_tokens: int | None  # the paper's length for this column, when it has one
    records: list[dict]

    @property
    def metric(self) -> str:
        return "string_match_all" if self.task in ruler.TASKS else "sub_em"

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The keys `score` returns."""
        if self.task in ruler.TASKS:
            return ("string_match_all", "accuracy")
        return ("em", "sub_em", "f1", "accuracy")

    def score(self, prediction: str | None, answers: list[str]) -> dict[str, float]:
        """Metrics of one answer (`metric_names`); "accuracy" is the column's headline metric
        (`metric`) in [0, 1]."""
        scores = (qa_scores(prediction, answers) if self.task not in ruler.TASKS
                  else {"string_match_all": string_match_all(prediction, answers)})
        return {**scores, "accuracy": scores[self.metric]}


def load_set(path: str, max_samples: int | None = None) -> EvalSet:
    """Reads and checks a set file; errors name the file, row and field."""
    records = read_set(path)
    if max_samples is not None:
        records = records[:max_samples]
    if not records:
        raise UserError(f"{path}: no samples")
    for row, record in enumerate(records):
        _check(record, f"{path}: row {row}")
    tasks = {r.get("task") or ("ruler_hqa" if "num_docs" in r else "qa") for r in records}
    if len(tasks) > 1:
        raise UserError(f"{path}: mixes tasks {', '.join(sorted(tasks))}; one task per file")
    task = tasks.pop()
    first = records[0]
    if task in ruler.TASKS:
        key, label, nominal = "length", ruler.length_label(first["length"]), first["length"]
    elif task == "ruler_hqa":
        key = "num_docs"
        label = hotpotqa.length_label(first["num_docs"])
        nominal = hotpotqa.NOMINAL_TOKENS.get(first["num_docs"])
    elif isinstance(first.get("length"), int):  # a QA set of one length (data synthetic)
        key, label, nominal = "length", ruler.length_label(first["length"]), first["length"]
    else:
        key, label, nominal = None, os.path.splitext(os.path.basename(path))[0], None
    if key and any(r.get(key) != first.get(key) for r in records):
        raise UserError(f"{path}: samples differ in '{key}'; one context length per file")
    name = os.path.splitext(os.path.basename(path))[0]
    return EvalSet(path, name, task, label, nominal, records)


def _check(record, where: str) -> None:
    if not isinstance(record, dict):
        raise UserError(f"{where}: expected an object")
    for field in ("input", "answers"):
        if record.get(field) is None:
            raise UserError(f"{where}: missing field '{field}'")
    for field in ("context", "input"):
        if field in record and not isinstance(record[field], str):
            raise UserError(f"{where}: field '{field}' must be a string")
    answers = record["answers"]
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str)
                                                               for a in answers):
        raise UserError(f"{where}: field 'answers' must be a non-empty list of strings")
    task = record.get("task")
    if task is not None:
        ruler.check_task(task)
        if not isinstance(record.get("length"), int):
            raise UserError(f"{where}: a RULER sample needs an integer 'length'")
    elif "num_docs" in record and not isinstance(record["num_docs"], int):
        raise UserError(f"{where}: field 'num_docs' must be an integer")


def load_sets(paths: list[str], max_samples: int | None = None) -> list[EvalSet]:
    """All sets of one eval: one task, distinct file names, each checked."""
    sets = [load_set(p, max_samples) for p in paths]
    names = [s.name for s in sets]
    for name in names:
        if names.count(name) > 1:
            raise UserError(f"data.sets: two files named {name} (results are kept per file name)")
    tasks = sorted({s.task for s in sets})
    if len(tasks) > 1:
        raise UserError(f"data.sets mix tasks {', '.join(tasks)}; run one eval per task")
    return sets
