"""Input files and outputs: clear errors before any work, outputs written all or nothing."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid

from memagent_jax.errors import UserError


def check_input_file(path: str) -> None:
    """Raises unless path is an existing file (a directory given as a file says so)."""
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory, expected a file")
    if not os.path.isfile(path):
        raise UserError(f"{path}: not found")


def check_output_file(path: str) -> None:
    """Raises unless a file can be written at path: not a directory, in an existing writable
    directory (checked before any work, so a long run cannot fail at its end)."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory, expected a file")
    if not os.path.isdir(parent):
        raise UserError(f"{path}: its directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UserError(f"{path}: its directory {parent} is not writable")


def check_new_output(out_dir: str) -> None:
    """Raises unless out_dir is free to write: absent, or an empty directory."""
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise UserError(f"{os.path.abspath(out_dir)}: output exists and is not empty; "
                        "choose a new path")


@contextlib.contextmanager
def atomic_directory(out_dir: str):
    """Yields a temporary sibling of out_dir to fill; renames it to out_dir on success.

    out_dir must not exist or be an empty directory. On any exception the temporary directory
    is removed, so a failed or interrupted write never leaves a half-written out_dir behind.
    In a multi-process job every process gets the same temporary directory, which process 0
    creates and renames once all have finished with it; what each process writes there is
    the caller's choice (Orbax writes from all of them, plain files come from process 0).
    """
    from memagent_jax import distributed

    out_dir = os.path.abspath(out_dir)
    check_new_output(out_dir)
    parent = os.path.dirname(out_dir)
    main = distributed.is_main()
    name = distributed.broadcast(uuid.uuid4().hex[:8])
    tmp = os.path.join(parent, f".{os.path.basename(out_dir)}.tmp-{name}")
    if main:
        os.makedirs(tmp)
    distributed.barrier(f"atomic_directory_made_{name}")
    try:
        yield tmp
        distributed.barrier(f"atomic_directory_written_{name}")
        if main:
            if os.path.isdir(out_dir):
                os.rmdir(out_dir)  # empty, checked above
            os.rename(tmp, out_dir)
    except BaseException:
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
