"""Data files: reading sources through `datasets`, reading and writing evaluation sets.

Sources (HotpotQA, or an existing set to take question indices from) are read with Hugging Face
`datasets`: a hub id where there is network (or from the datasets cache with HF_HUB_OFFLINE=1;
`load_from_hub` fails at once where the hub is out of reach), or local .json/.jsonl/.parquet
files. Evaluation sets are read WITHOUT `datasets` (GPU images often lack it): a .json list
(the original's `eval_{N}.json`), .jsonl, or .parquet (pyarrow). Sets are written as a JSON
list, streamed record by record into a temporary file that is renamed into place, so a set
file is either complete or absent (and a full disk is one line naming it).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import urllib.parse
from collections.abc import Callable, Iterable

from memagent_jax.errors import UserError
from memagent_jax.extras import needs
from memagent_jax.fileutil import atomic_file, json_lines

_LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}
HUB_TIMEOUT_S = 3  # how long `load_from_hub` waits for a connection to the hub


def load_source(source: str, split: str | None = None, name: str | None = None,
                default_name: str | None = None, default_split: str = "validation"):
    """A `datasets.Dataset` from local files (one path, or several joined by commas) or a hub
    id. Local files form the "train" split of their builder; for a hub id, `name` (default
    `default_name`) is the dataset configuration and `split` (default `default_split`)."""
    with needs("data", "reading data sources"):
        import datasets
    paths = [p for p in source.split(",") if p]
    if paths and all(os.path.exists(p) for p in paths):
        kinds = {os.path.splitext(p)[1].lower() for p in paths}
        if len(kinds) != 1 or next(iter(kinds)) not in _LOCAL_BUILDERS:
            raise UserError(f"{source}: expected .json, .jsonl or .parquet files of one kind")
        builder = _LOCAL_BUILDERS[kinds.pop()]
        try:
            with quiet(datasets):
                return datasets.load_dataset(builder, data_files=paths, split="train")
        except Exception as e:  # pyarrow/json errors of many types
            raise UserError(unreadable_json(paths) or (
                f"{source}: cannot read ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''})")) from None
    if len(paths) != 1 or not looks_like_hub_id(source):
        raise UserError(f"{source}: file not found")
    return load_from_hub(lambda: datasets.load_dataset(source, name or default_name,
                                                       split=split or default_split), source)


@contextlib.contextmanager
def quiet(datasets):
    """`datasets` logging nothing, its errors included, while it reads: a file it cannot read
    is one line of ours (`unreadable_json`), not its log lines and then ours."""
    previous = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(previous)


def unreadable_json(paths: list[str]) -> str | None:
    """Why `datasets` read no records from these local files, as one line naming the first
    .json or .jsonl file that is empty, or not valid JSON (and where: `json_lines`); None where
    each parses (it failed for another reason)."""
    for path in paths:
        ext = os.path.splitext(path)[1].lower()
        if ext not in (".json", ".jsonl") or not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as e:
            return f"{path}: not UTF-8 text (byte offset {e.start})"
        if not text.strip():
            return f"{path}: the file is empty (no records)"
        if ext == ".json":
            try:
                json.loads(text)
                continue
            except json.JSONDecodeError as e:
                if e.msg != "Extra data":  # else JSON lines, as `datasets` reads .json too
                    return f"{path}: not valid JSON ({e.msg} at line {e.lineno})"
        try:
            json_lines(path)
        except UserError as e:
            return str(e)
    return None


def load_from_hub(load: Callable, what: str):
    """load() (a `datasets.load_dataset` call for a source on the Hugging Face hub) and its
    result; errors are one line starting with `what` (the source, and the key that named it)
    that says how to do without the hub. Where HF_HUB_OFFLINE is not set and no connection to
    the hub opens within HUB_TIMEOUT_S, fails at once: huggingface_hub would retry for some 25
    seconds before failing. With HF_HUB_OFFLINE set, `datasets` reads its cache only."""
    from huggingface_hub import constants
    local = "a local .parquet, .json or .jsonl file (downloaded where there is network)"
    if not constants.HF_HUB_OFFLINE:
        url = urllib.parse.urlparse(constants.ENDPOINT)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((url.hostname, port), timeout=HUB_TIMEOUT_S).close()
        except OSError as e:
            raise UserError(f"{what}: a Hugging Face hub dataset, and the hub is out of reach "
                            f"(no connection to {url.hostname}: {e.strerror or e}); give "
                            f"{local} instead, or set HF_HUB_OFFLINE=1 to read it from the "
                            "datasets cache") from None
    try:
        return load()
    except Exception as e:  # hub and network errors of many types
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        where = ("the datasets cache (HF_HUB_OFFLINE is set)" if constants.HF_HUB_OFFLINE
                 else "the Hugging Face hub")
        raise UserError(f"{what}: cannot load it from {where}: {reason}; give {local} "
                        "instead") from None


def looks_like_hub_id(spec: str) -> bool:
    """'owner/name' (one slash, no file extension, not a relative or home path): what a source
    that is not an existing path is read as, from the Hugging Face hub."""
    parts = spec.split("/")
    return (len(parts) == 2 and all(parts) and not spec.startswith((".", "~"))
            and not spec.endswith(tuple(_LOCAL_BUILDERS)))


def read_set(path: str) -> list[dict]:
    """All records of an evaluation set file (.json list, .jsonl or .parquet)."""
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory, expected an evaluation set file")
    if not os.path.isfile(path):
        raise UserError(f"{path}: evaluation set not found")
    ext = os.path.splitext(path)[1].lower()
    if ext == ".parquet":
        with needs("data", "reading .parquet sets"):
            import pyarrow.parquet as pq
        return pq.read_table(path).to_pylist()
    if ext not in (".json", ".jsonl"):
        raise UserError(f"{path}: expected a .json, .jsonl or .parquet evaluation set")
    if ext == ".json":
        with open(path, encoding="utf-8") as f:
            try:
                records = json.load(f)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(records, list):
            raise UserError(f"{path}: expected a JSON list of records")
        return records
    return [record for _, record in json_lines(path)]


def write_set(path: str, records: Iterable[dict]) -> int:
    """Streams records into `path` as a JSON list (one record per line inside the brackets);
    returns how many. Written whole or not at all (`atomic_file`). `records` is closed when
    the write ends, failed or not, if it can be (a generator, a progress bar): a bar then
    prints its last line before the error is reported, not after."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    count = 0
    try:
        with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.write("[")
            for record in records:
                f.write(",\n" if count else "\n")
                f.write(json.dumps(record, ensure_ascii=False))
                count += 1
            f.write("\n]\n")
    finally:
        getattr(records, "close", lambda: None)()
    return count


def write_parquet(path: str, rows: list[dict]) -> None:
    """rows as one parquet table, written whole or not at all (`atomic_file`)."""
    with needs("data", "writing parquet files"):
        import pyarrow as pa
        import pyarrow.parquet as pq
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_file(path) as tmp:
        pq.write_table(pa.Table.from_pylist(rows), tmp)
