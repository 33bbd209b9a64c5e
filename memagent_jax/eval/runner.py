"""`memagent-jax eval`: one method over evaluation sets at several lengths, resumable.

Order of work: read and check every set and the tokenizer (bad input fails before any device
work); claim the output dir (a rerun must have the same settings); count the samples already
in the per-set logs; load the model only if some are left; run the rest in batches, each
finished question one durable JSONL line; then summarise from the logs and write the report.

Output dir:
  run.json                 settings the results depend on (checked on resume)
  samples/<set>.jsonl      one line per question: {row, index, question, answers, <metrics>,
                           context_tokens, turns, runs: [{pred, reply, finish_reason,
                           response_tokens, <metrics>}]}  (metrics in [0, 1], mean over runs)
  summary.json             this run's row: per set {label, samples, tokens, metrics x 100}
  table.md, table.json     rows = model/method (+ compared runs, + the paper), columns = lengths
  accuracy.png             accuracy vs context length, log x

In a multi-process job (a pod) every process runs the model on the same questions (the engine
is one SPMD program over all hosts' devices); process 0 alone claims the output dir, keeps the
logs and writes the report, and tells the others which questions are left.
"""

from __future__ import annotations

import dataclasses
import itertools
import os

from memagent_jax.console import announce, progress_bar
from memagent_jax.distributed import collectives
from memagent_jax.errors import Interrupted, UserError
from memagent_jax.eval.config import EvalConfig
from memagent_jax.eval.methods import AgentMethod, FullContextMethod
from memagent_jax.eval.report import markdown, write_report
from memagent_jax.eval.results import OutputDir, ResultLog
from memagent_jax.eval.sets import EvalSet, load_sets
from memagent_jax.fileutil import check_output_dir


def make_method(config: EvalConfig, tokenizer):
    """The method a config names: an agent (MemAgent, or the `agent` section's) on the engine
    or a server (model.url), or the full-context baseline."""
    return (FullContextMethod if config.method == "full_context" else AgentMethod)(config,
                                                                                  tokenizer)


class Progress:
    """Two bars on stderr: questions finished, and model calls (`calls`: MemAgent's "chunks"
    and answers, an agent's "calls", full context's "answers")."""

    def __init__(self, samples: int, calls: str):
        quiet = not collectives.is_main()
        self.samples = progress_bar(total=samples, desc="samples", unit="sample", position=0,
                                    disable=quiet)
        self.turns = progress_bar(total=0, desc=calls, unit="call", position=1,
                                  disable=quiet)

    def add_turns(self, count: int) -> None:
        self.turns.total += count
        self.turns.refresh()

    def turn(self) -> None:
        self.turns.update(1)

    def close(self) -> None:
        self.turns.close()
        self.samples.close()


def run_eval(config: EvalConfig, method=None) -> dict | None:
    """Runs what is left of the eval and returns its summary, with the report's "table" and
    the names of the files "written" (None on processes other than 0). `method` replaces the
    one the config names (tests drive the runner with scripted answers this way)."""
    sets = load_sets(config.data.sets, config.data.max_samples)
    tokenizer = config.model.load_tokenizer(required=True)
    method = method or make_method(config, tokenizer)
    for s in sets:
        for row, record in enumerate(s.records):
            method.check(s.path, row, record)
    check_output_dir(config.output_dir, "output_dir")
    out, logs = _claim(config, sets)
    try:
        todo = [(s, [r for r in range(len(s.records)) if r not in logs[s.name].records])
                for s in sets]
        remaining = sum(len(rows) for _, rows in todo)
        _announce(config, sets, remaining)
        if remaining:
            method.start()  # loads the model: only when something is left to do
            progress = Progress(remaining, {"memagent": "chunks", "agent": "calls"}.get(
                config.method, "answers"))
            try:
                for s, rows in todo:
                    _run_set(method, s, rows, logs[s.name], progress, config.data.batch_size)
            except KeyboardInterrupt:
                done = sum(len(log.records) for log in logs.values())
                raise Interrupted(f"interrupted; the {done} finished questions are kept in "
                                  f"{config.output_dir}: run the same command to resume"
                                  ) from None
            finally:
                progress.close()
        if out is None:
            return None
        summary = summarize(config, sets, logs)
    finally:
        for log in logs.values():
            log.close()
        if out is not None:
            out.close()
    summary["table"], summary["written"] = write_report(
        config.output_dir, summary, config.report.compare, config.report.published)
    return summary


def _announce(config: EvalConfig, sets: list[EvalSet], remaining: int) -> None:
    """What the eval is about to do, before the model loads (process 0)."""
    import jax
    m, s = config.model, config.sampling
    if config.method == "memagent":
        b = config.memagent
        budgets = (f"chunks of {b.chunk_tokens} tokens, memory {b.max_memory_tokens}, final "
                   f"answer {b.max_final_tokens}")
    elif config.method == "agent":
        budgets = f"the agent {config.loaded_agent.name}"
    else:
        f = config.full_context
        window = f"{f.max_input_tokens} tokens" if f.max_input_tokens else "the model's window"
        budgets = f"prompts of {window}, answers of {f.max_new_tokens} tokens"
    mesh = config.mesh or ("fsdp over all" if jax.process_count() > 1 else "one device")
    announce(f"eval: {config.row_name}, {config.method}", {
        "model": (m.path or f"preset {m.preset}") + (f" on the server {m.url}" if m.url else ""),
        "data": f"{len(sets)} set(s), {sum(len(x.records) for x in sets)} questions "
                f"({remaining} left): {', '.join(x.name for x in sets)}",
        "devices": "the server's" if m.url else f"{jax.device_count()} "
                   f"{jax.default_backend()} device(s), mesh {mesh}",
        "budgets": f"{budgets}; {config.engine.slots} decode slots",
        "sampling": f"{s.n} answer(s) a question, temperature {s.temperature}, top_p {s.top_p}",
        "output": config.output_dir})


class _Replica:
    """What processes other than 0 keep instead of a ResultLog: the finished rows, no file."""

    def __init__(self, rows):
        self.records = dict.fromkeys(rows)

    def append(self, record: dict) -> None:
        self.records[record["row"]] = record

    def close(self) -> None:
        pass


def _claim(config: EvalConfig, sets: list[EvalSet]) -> tuple[OutputDir | None, dict]:
    """Process 0 claims the output dir and opens the logs; every process learns which rows are
    done, or process 0's error. Returns (the OutputDir or None, {set name: log})."""
    opened: dict = {}

    def claim() -> dict[str, list]:
        out = opened["out"] = OutputDir(config.output_dir, config.identity())
        try:
            logs = opened["logs"] = {s.name: out.log(s.name) for s in sets}
            for s in sets:
                _check_log_matches(s, logs[s.name])
        except BaseException:
            for log in opened.pop("logs", {}).values():
                log.close()
            opened.pop("out").close()
            raise
        return {name: list(log.records) for name, log in logs.items()}

    done = collectives.on_main(claim)
    if "out" not in opened:
        return None, {name: _Replica(rows) for name, rows in done.items()}
    return opened["out"], opened["logs"]


def _check_log_matches(s: EvalSet, log: ResultLog) -> None:
    """A set rebuilt differently under the same name must not be mixed with old results."""
    for row, line in log.records.items():
        if row < len(s.records) and line["question"] != s.records[row]["input"]:
            raise UserError(f"{log.path}: row {row} holds results for another question than "
                            f"{s.path} row {row}: the set changed; choose a new output_dir")


def _run_set(method, s: EvalSet, rows: list[int], log: ResultLog, progress: Progress,
             batch_size: int) -> None:
    def done(row: int, answers, info: dict) -> None:
        record = s.records[row]
        runs = [{**dataclasses.asdict(a), **s.score(a.pred, record["answers"])}
                for a in answers]
        means = {k: sum(run[k] for run in runs) / len(runs) for k in s.metric_names}
        log.append({"row": row, "index": record.get("index", row),
                    "question": record["input"], "answers": record["answers"], **means,
                    **info, "runs": runs})
        progress.samples.update(1)

    for start in range(0, len(rows), batch_size):
        batch = [(row, s.records[row]) for row in rows[start:start + batch_size]]
        method.run(s.name, batch, on_done=done, on_turn=progress.turn,
                   add_turns=progress.add_turns)


def summarize(config: EvalConfig, sets: list[EvalSet], logs: dict[str, ResultLog]) -> dict:
    """This run's table row: per set the mean of each metric x 100 over its questions."""
    columns = []
    for s in sets:
        lines = [logs[s.name].records[r] for r in range(len(s.records))
                 if r in logs[s.name].records]
        if len(lines) < len(s.records):
            raise UserError(f"{s.path}: {len(s.records) - len(lines)} samples have no result")
        column = {"set": s.name, "label": s.label, "samples": len(lines),
                  "tokens": sum(line["context_tokens"] for line in lines) / len(lines),
                  "nominal_tokens": s.nominal_tokens,
                  "turns": sum(line["turns"] for line in lines) / len(lines)}
        column.update({k: 100 * sum(line[k] for line in lines) / len(lines)
                       for k in s.metric_names})
        columns.append(column)
    columns.sort(key=lambda c: c["tokens"])
    return {"model": config.row_name, "method": config.method, "task": sets[0].task,
            "metric": sets[0].metric, "n": config.sampling.n, "columns": columns}


def main(config_path: str, overrides: list[str]) -> None:
    """The CLI entry: load the config, run, print the table."""
    from memagent_jax.runconfig import load_config
    config = load_config(EvalConfig, config_path, overrides)
    _check_sets_are_made(config, config_path)
    summary = run_eval(config)
    if summary is None:
        return
    print(markdown(summary["table"]), end="")
    print(f"results in {config.output_dir} ({', '.join(summary['written'])}, samples/)")


def _check_sets_are_made(config: EvalConfig, config_path: str) -> None:
    """Where a set of data.sets is not there and the config's header (its leading comments)
    gives the `memagent-jax data` commands that make its sets, as the shipped configs' do,
    the error says to run them: a set not made yet is the usual case, not a wrong path."""
    missing = [path for path in config.data.sets if not os.path.exists(path)]
    if not missing:
        return
    with open(config_path, encoding="utf-8") as f:
        header = "".join(itertools.takewhile(lambda line: line.startswith("#"), f))
    if "memagent-jax data" in header:
        raise UserError(f"{missing[0]}: evaluation set not found; make it with the commands "
                        f"in the header of {config_path}")
