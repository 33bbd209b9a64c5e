"""The eval's output directory: per-sample JSONL logs that survive a crash, and its guard.

Each finished sample is ONE line appended to `samples/<set>.jsonl`, written with a single
write, flushed and fsynced before the next sample counts as done. A crash can therefore only
leave a torn LAST line (no trailing newline); reopening the log drops it (truncating the file),
so a rerun evaluates exactly the samples that have no complete line: none twice, none lost.

The directory also keeps `run.json` (the settings the results depend on, see
`EvalConfig.identity`): a rerun with different settings is refused rather than mixed in. An
exclusive lock (`.lock`, flock) keeps two evals from appending to the same logs.
"""

from __future__ import annotations

import fcntl
import json
import os

from memagent_jax.errors import UserError
from memagent_jax.fileutil import atomic_file


class ResultLog:
    """Append-only JSONL of per-sample results, keyed by their "row"."""

    def __init__(self, path: str):
        self.path = path
        self.records: dict[int, dict] = {}
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if os.path.exists(path):
            self._load()
        self._file = open(path, "ab")  # noqa: SIM115 - appended to until close()

    def _load(self) -> None:
        with open(self.path, "rb") as f:
            data = f.read()
        complete = data.rfind(b"\n") + 1  # bytes after the last newline: a torn write
        if complete < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(complete)
                f.flush()
                os.fsync(f.fileno())
        self.records = _parse(data[:complete], self.path)

    def append(self, record: dict) -> None:
        """Durably adds one sample's result (record["row"] must be new)."""
        if record["row"] in self.records:
            raise ValueError(f"row {record['row']} is already in {self.path}")
        self._file.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        self._file.flush()
        os.fsync(self._file.fileno())
        self.records[record["row"]] = record

    def close(self) -> None:
        self._file.close()


def read_summary(out_dir: str, where: str = "") -> dict:
    """A finished eval output directory's summary.json; UserError (after `where`, the key that
    named it) where it has none."""
    path = os.path.join(out_dir, "summary.json")
    if not os.path.isfile(path):
        raise UserError(f"{where}{out_dir}: no summary.json (not a finished eval output "
                        "directory)")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_results(path: str) -> dict[int, dict]:
    """The per-sample results of a finished log, {row: record}, read only (a log whose last
    line is torn belongs to an unfinished eval: refused, the file left as it is)."""
    with open(path, "rb") as f:
        data = f.read()
    if data and not data.endswith(b"\n"):
        raise UserError(f"{path}: its last line is torn (an interrupted eval; run it again to "
                        "finish)")
    return _parse(data, path)


def _parse(data: bytes, path: str) -> dict[int, dict]:
    records: dict[int, dict] = {}
    for number, line in enumerate(data.splitlines(), start=1):
        try:
            record = json.loads(line)
            row = record["row"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
            raise UserError(f"{path} line {number}: not a result line; the file is "
                            "damaged (move it away to re-run that set)") from None
        if row in records:
            raise UserError(f"{path} line {number}: row {row} appears twice")
        records[row] = record
    return records


class OutputDir:
    """Claims `path` for one eval: takes the lock, checks or writes run.json."""

    def __init__(self, path: str, identity: dict):
        self.path = path
        os.makedirs(path, exist_ok=True)
        self._lock = open(os.path.join(path, ".lock"), "w")  # noqa: SIM115 - held: the lock
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise UserError(f"{path}: another eval is writing there") from None
        run_file = os.path.join(path, "run.json")
        if os.path.exists(run_file):
            with open(run_file, encoding="utf-8") as f:
                previous = json.load(f)
            from memagent_jax.runconfig import differences  # yaml: eval-compare runs without
            changed = differences(previous, json.loads(json.dumps(identity)))
            if changed:
                self.close()
                raise UserError(f"{path} holds results of a different run "
                                f"({'; '.join(changed)}); choose a new output_dir")
        else:
            with atomic_file(run_file) as tmp, open(tmp, "w", encoding="utf-8") as f:
                json.dump(identity, f, indent=2)

    def log(self, set_name: str) -> ResultLog:
        return ResultLog(os.path.join(self.path, "samples", f"{set_name}.jsonl"))

    def close(self) -> None:
        self._lock.close()  # releases the flock
