"""Input files and outputs: clear errors before any work, outputs written all or nothing."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import uuid
from typing import Any

from memagent_jax.errors import UserError


def check_input_file(path: str) -> None:
    """Raises unless path is an existing regular file: a directory, or something else that is
    there (a FIFO, a device such as /dev/urandom, which a read would wait on or never end),
    says what it is."""
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory, expected a file")
    if os.path.exists(path) and not os.path.isfile(path):
        raise UserError(f"{path}: not a regular file (a pipe, a device or a socket), expected "
                        "a file")
    if not os.path.isfile(path):
        raise UserError(f"{path}: not found")


def json_lines(path: str) -> list[tuple[int, Any]]:
    """(line number, value) of each non-blank line of a JSON-lines file, in order; UserError
    naming the file, and the line and column where one is not valid JSON, or that the file is
    not UTF-8 text."""
    with open(path, encoding="utf-8") as f:
        try:
            lines = f.readlines()
        except UnicodeDecodeError as e:
            raise UserError(f"{path}: not UTF-8 text (byte offset {e.start})") from None
    values = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            values.append((number, json.loads(line)))
        except json.JSONDecodeError as e:
            # e.msg alone can stop mid-sentence ("Invalid control character at"); e.pos is the
            # column in this line (the line is the whole JSON text), past its text where the
            # line was cut short.
            at = "" if e.msg.endswith(" at") else " at"
            column = (f"column {e.pos + 1}" if e.pos < len(line.rstrip())
                      else "the end of the line")
            raise UserError(f"{path} line {number}: not valid JSON: {e.msg}{at} {column}"
                            ) from None
    return values


def check_output_file(path: str) -> None:
    """Raises unless a new file can be written at path (the command's --out): not a directory,
    in an existing writable directory, and none there yet (outputs are never overwritten);
    checked before any work, so a long run cannot fail at its end."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory, expected a file")
    if not os.path.isdir(parent):
        raise UserError(f"{path}: its directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UserError(f"{path}: its directory {parent} is not writable")
    check_new_files([path], "--out")


def check_output_dir(path: str, name: str) -> None:
    """Raises unless a directory can be at `path`: one is there, or nothing is and no file is
    in the way above it. `name`: the flag or config key that gave the path."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        where = "" if existing == os.path.abspath(path) else f"cannot be made: {existing} "
        raise UserError(f"{name}: {path} {where}is a file, not a directory")


def check_new_files(paths: list[str], name: str) -> None:
    """Raises if any of `paths` exists (the files a command is about to write: outputs are
    never overwritten); `name`: the flag that chose them."""
    for path in paths:
        if os.path.exists(path):
            raise UserError(f"{name}: {path} exists; remove it or choose another {name}")


def check_new_output(out_dir: str, name: str = "output") -> None:
    """Raises unless out_dir is free to write: absent, or an empty directory. `name`: the
    flag that gave it."""
    check_output_dir(out_dir, name)
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise UserError(f"{os.path.abspath(out_dir)}: output exists and is not empty; "
                        "choose a new path")


def is_disk_full(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from, says the file system is out of space
    (ENOSPC, or EDQUOT: a quota): an OSError with that errno, or the C library's text for it
    in another type's message, which is how TensorStore (under Orbax: a ValueError) and
    tokenizers (a bare Exception) report it."""
    texts = [os.strerror(code) for code in (errno.ENOSPC, errno.EDQUOT)]
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(text in str(error) for text in texts):
            return True
        error = error.__cause__ or error.__context__
    return False


def disk_full_error(path: str, kept: str) -> UserError:
    """The one line for a write to `path` that ran out of space; `kept`: what is on disk now,
    and how to go on."""
    return UserError(f"no space left on device writing {path}; {kept}")


@contextlib.contextmanager
def atomic_file(path: str):
    """Yields a temporary name beside `path` to write; renames it to `path` on success.

    On any exception the temporary file is removed, so `path` is whole or absent; a disk
    that filled up is a UserError naming `path`."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        yield tmp
        os.replace(tmp, path)
    except Exception as e:
        if is_disk_full(e):
            raise disk_full_error(path, "it was not written (free some space and run the "
                                        "command again)") from None
        raise
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@contextlib.contextmanager
def atomic_directory(out_dir: str):
    """Yields a temporary sibling of out_dir to fill; renames it to out_dir on success.

    out_dir must not exist or be an empty directory. On any exception the temporary directory
    is removed, so a failed or interrupted write never leaves a half-written out_dir behind.
    A disk that filled up is a UserError naming out_dir. In a multi-process job every
    process gets the same temporary directory, which process 0 creates and renames once all
    have finished with it (before any of them returns); what each process writes there is the
    caller's choice (Orbax writes from all of them, plain files come from process 0), and a
    failure on one process is raised on every process.
    """
    from memagent_jax.distributed import collectives

    out_dir = os.path.abspath(out_dir)
    check_new_output(out_dir)
    parent = os.path.dirname(out_dir)
    name = collectives.broadcast(uuid.uuid4().hex[:8])
    tmp = os.path.join(parent, f".{os.path.basename(out_dir)}.tmp-{name}")
    collectives.on_main(os.makedirs, tmp)
    try:
        failure = None
        try:
            yield tmp
        except Exception as e:  # every process must learn of it (below)
            failure = e
        # Process 0 often writes alone here: had it failed, the others would wait for it.
        failed = [p for p, f in enumerate(collectives.gather(failure is not None)) if f]
        if failed:
            collectives.on_main(shutil.rmtree, tmp, True)
            if failure is not None and is_disk_full(failure):
                raise disk_full_error(out_dir, "nothing of it was kept (free some space and "
                                               "run the command again)") from None
            raise failure or RuntimeError(f"{out_dir}: process(es) {failed} failed writing it")
        collectives.on_main(_replace, tmp, out_dir)  # returns once it is renamed
    except BaseException:
        if collectives.is_main():
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace(tmp: str, out_dir: str) -> None:
    if os.path.isdir(out_dir):
        os.rmdir(out_dir)  # empty, checked before writing
    os.rename(tmp, out_dir)
