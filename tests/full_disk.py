"""A disk that fills up, simulated where the writes happen (a size-limited file system needs
root to mount): the commands must stop with one line naming what they were writing, leave
nothing partial, and keep what was there before.

Two writers are covered: Python's own file writes (`open`), and Orbax's array writes, which
TensorStore makes in C++ out of Python's sight; each fails as it does on a full disk (checked
on small tmpfs mounts: OSError ENOSPC, and TensorStore's ValueError quoted below)."""

from __future__ import annotations

import builtins
import errno
import json
import os

# What TensorStore raises under Orbax on a full disk (its text, from a real one).
TENSORSTORE_ENOSPC = (
    'RESOURCE_EXHAUSTED: Error writing "embed/0.0" in OCDBT database at local file "{path}": '
    "Failed to write 81831 bytes to file 4: No space left on device [os_error_code='28']")


def fill_disk_after(monkeypatch, under, nbytes: int) -> dict:
    """Python's writes to files under the directory `under` fail as on a full disk
    (OSError ENOSPC, no file name, as a buffered write reports it) once `nbytes` bytes have
    been written there in all; the file keeps what fitted. Returns {"written": bytes}."""
    under = os.path.abspath(under) + os.sep
    real_open, state = builtins.open, {"written": 0}

    class FillingFile:
        def __init__(self, file):
            self._file = file

        def write(self, data):
            size = len(data.encode()) if isinstance(data, str) else memoryview(data).nbytes
            room = nbytes - state["written"]
            if size > room:
                self._file.write(data[:room] if isinstance(data, str) else
                                 memoryview(data).cast("B")[:room])
                state["written"] = nbytes
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            state["written"] += size
            return self._file.write(data)

        def writelines(self, lines):
            for line in lines:
                self.write(line)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._file.close()

        def __iter__(self):
            return iter(self._file)

        def __getattr__(self, name):
            return getattr(self._file, name)

    def filling_open(file, mode="r", *args, **kwargs):
        opened = real_open(file, mode, *args, **kwargs)
        writing = any(m in mode for m in "wax+")
        if writing and isinstance(file, (str, os.PathLike)) and os.path.abspath(
                file).startswith(under):
            return FillingFile(opened)
        return opened

    monkeypatch.setattr(builtins, "open", filling_open)
    return state


def fail_orbax_writes(monkeypatch, when=lambda where: True) -> list[str]:
    """Orbax's array writes whose TensorStore spec `when` accepts (its JSON text: the paths
    written) fail as on a full disk: the ValueError TensorStore raises, raised in Orbax's
    background thread where an async save runs, and nothing of the array written; what Orbax
    made before (the step's temporary directories, the other arrays) is on disk, a partial
    checkpoint. Returns the specs that failed."""
    from orbax.checkpoint._src.serialization import serialization

    real, failed = serialization.async_serialize_from_host, []

    async def write_or_fail(rslices_on_host, tensorstore_spec, *args, **kwargs):
        where = json.dumps(tensorstore_spec, default=str)
        if when(where):
            failed.append(where)
            raise ValueError(TENSORSTORE_ENOSPC.format(path=where))
        await real(rslices_on_host, tensorstore_spec, *args, **kwargs)

    monkeypatch.setattr(serialization, "async_serialize_from_host", write_or_fail)
    return failed
