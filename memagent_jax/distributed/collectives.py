"""What keeps a job's processes in agreement once `startup.start` has joined them: `to_host`
(a global array, whole, on every host), `gather` and `broadcast` (Python values), `on_main`
(work only process 0 does, its failure raised on every process), `check_same` (a lockstep
check that fails loudly), `check_shared_directory` (every process sees what process 0 writes)
and `is_main` (process 0, the one that writes logs and outputs).

Every process of the job calls each of them but `is_main` at the same point, in the same
order (they are collectives); on a process not part of a multi-process job (`startup.joined()`
false) each gives the one-process answer and runs no collective. At import only the standard
library, `startup` and `errors` (JAX loads inside the functions): the command modules import
this module.
"""

from __future__ import annotations

import os
import pickle
import time
from typing import Any

from memagent_jax.distributed.startup import joined
from memagent_jax.errors import UserError


def is_main() -> bool:
    """Process 0: the one that writes logs and outputs."""
    import jax
    return not joined() or jax.process_index() == 0


def to_host(tree: Any) -> Any:
    """Every array of `tree`, whole, as NumPy on every process (a global array split across
    hosts cannot be read directly)."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    if not joined():
        return jax.device_get(tree)

    def fetch(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if x.is_fully_replicated:
                return np.asarray(x.addressable_data(0))
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return jax.device_get(x)

    return jax.tree.map(fetch, tree)


def gather(value: Any) -> list:
    """[process 0's value, process 1's, ...] on every process (any picklable value)."""
    if not joined():
        return [value]
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    data = np.frombuffer(pickle.dumps(value), np.uint8)
    sizes = multihost_utils.process_allgather(np.array([data.size]))
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    everything = multihost_utils.process_allgather(padded)
    return [pickle.loads(everything[p, :int(sizes[p, 0])].tobytes())
            for p in range(jax.process_count())]


def broadcast(value: Any) -> Any:
    """Process 0's value, on every process."""
    return gather(value)[0]


def check_same(what: str, value: Any) -> None:
    """Raises RuntimeError on every process when the processes' values differ: hosts that
    drifted apart would otherwise feed different data to one SPMD program."""
    values = gather(value)
    if any(v != values[0] for v in values[1:]):
        import jax
        differing = [p for p, v in enumerate(values) if v != values[0]]
        raise RuntimeError(f"the processes are out of step: {what} differs on process(es) "
                           f"{differing} from process 0 (process {jax.process_index()} has "
                           f"{value!r:.200})")


def on_main(fn, *args) -> Any:
    """fn(*args) on process 0 only, its (picklable) result on every process. When it raises,
    process 0 raises that and every other process raises its message (UserError for a
    UserError, else RuntimeError), so none waits forever for a process that failed."""
    if not joined():
        return fn(*args)
    result, failure = None, None
    if is_main():
        try:
            result = fn(*args)
        except Exception as e:  # reported to every process, then re-raised
            failure = e
    ok, user_error, payload = broadcast(
        (True, False, result) if failure is None else
        (False, isinstance(failure, UserError), str(failure) or type(failure).__name__))
    if failure is not None:
        raise failure
    if not ok:
        raise (UserError(payload) if user_error
               else RuntimeError(f"process 0 failed: {payload}"))
    return payload


def check_shared_directory(path: str, what: str, timeout_s: float = 10) -> None:
    """Raises UserError on every process unless all of them see what process 0 writes under
    `path` (a local path or a gs:// URL): training checkpoints written by one host must be
    restorable by all. A no-op on one process."""
    if not joined():
        return
    from etils import epath

    directory = epath.Path(path)
    marker = directory / f".memagent_jax_job_{broadcast(os.urandom(8).hex())}"

    def write_marker():
        directory.mkdir(parents=True, exist_ok=True)
        marker.write_text("written by process 0 at start-up; deleted once every process has "
                          "looked for it\n")

    on_main(write_marker)
    deadline = time.monotonic() + timeout_s
    while not (seen := marker.exists()) and time.monotonic() < deadline:
        time.sleep(0.5)  # shared file systems may show a new file late
    seen_by = gather(seen)
    if is_main():
        marker.unlink(missing_ok=True)
    blind = [p for p, ok in enumerate(seen_by) if not ok]
    if blind:
        raise UserError(f"{what} {path}: process(es) {blind} do not see what process 0 writes "
                        "there; every process of a job must see the same directory (a gs:// "
                        "bucket or a shared file system; docs/guides/pods.md)")
