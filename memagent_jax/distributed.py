"""One job over many processes (a TPU pod's hosts, a GPU cluster's nodes): start-up, and the
few host-side collectives the commands need.

Every command that touches devices calls `start()` before anything else uses JAX. Where its
coordinates come from, first match wins:
1. flags: `--coordinator HOST:PORT --num-processes N --process-id I [--local-device-ids 0,1]`;
2. the environment: `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID` (and
   JAX's own `JAX_LOCAL_DEVICE_IDS`), as Orbax's multi-host test runner sets them;
3. with `--distributed` (train: `distributed: true`), JAX's cluster auto-detection: Cloud TPU
   VMs, SLURM, Open MPI, Kubernetes;
4. otherwise one process.
Start-up is bounded by `timeout_s`: a coordinator that never answers, or a process that never
joins, ends every process with one line (`UserError`) instead of JAX's abort after its own
deadline. Once up, the processes compare what each was told (process count, and a fingerprint
of the command line), so a job started with mismatched flags stops at once, on every process.
On CPU the collectives go through gloo, and simulated CPU devices get twice their number of
threads (`reserve_cpu_threads`).

After `start()`, `jax.process_index()`/`process_count()` say who is who. The helpers below are
what keeps hosts in agreement: `to_host` (a global array, whole, on every host), `gather` and
`broadcast` (Python values), `on_main` (work only process 0 does, its failure raised on
every process) and `check_same` (a lockstep check that fails loudly).
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import pickle
import re
import sys
import threading
import time
from typing import Any

from memagent_jax.errors import UserError

_ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


@dataclasses.dataclass(frozen=True)
class Launch:
    """Where this process stands in its job (module docstring); None: from the environment."""
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None
    timeout_s: int = 300
    auto: bool = False


def add_flags(parser) -> None:
    """The start-up flags every device command takes (see the module docstring)."""
    group = parser.add_argument_group(
        "multi-process jobs (default: one process; env JAX_COORDINATOR_ADDRESS, "
        "JAX_NUM_PROCESSES, JAX_PROCESS_ID)")
    group.add_argument("--coordinator", metavar="HOST:PORT",
                       help="process 0's address, the same on every process")
    group.add_argument("--num-processes", type=int, metavar="N")
    group.add_argument("--process-id", type=int, metavar="I", help="0 .. N-1")
    group.add_argument("--local-device-ids", metavar="0,1,...",
                       help="the devices this process drives (default: all it sees)")
    group.add_argument("--distributed", action="store_true",
                       help="detect the job from the cluster (Cloud TPU VM, SLURM, Open MPI)")
    group.add_argument("--start-timeout", type=int, default=300, metavar="SECONDS",
                       help="how long processes wait for each other at start-up")


def launch_from_flags(args, auto: bool = False) -> Launch:
    """The Launch the flags of `add_flags` describe (auto: --distributed, or a config's
    `distributed: true`)."""
    ids = None
    if args.local_device_ids:
        try:
            ids = tuple(int(i) for i in args.local_device_ids.split(","))
        except ValueError:
            raise UserError(f"--local-device-ids: expected integers such as 0,1,2,3, got "
                            f"{args.local_device_ids!r}") from None
    if args.start_timeout <= 0:
        raise UserError(f"--start-timeout must be positive, got {args.start_timeout}")
    return Launch(args.coordinator, args.num_processes, args.process_id, ids,
                  args.start_timeout, auto or args.distributed)


def start(launch: Launch = Launch(), fingerprint: str = "") -> None:
    """Joins this process to its job (module docstring); a no-op for a single process or when
    already joined. fingerprint: what every process must agree on (the command line)."""
    reserve_cpu_threads()
    import jax
    from jax._src import distributed as jax_distributed

    if jax_distributed.global_state.client is not None:
        return
    coordinator, count, index = _coordinates(launch)
    if coordinator is None and not launch.auto:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_enable_preemption_service", False)  # see PreemptionNotice
    where = (f"process {index} of {count}, coordinator {coordinator}" if coordinator
             else "cluster auto-detection")
    done = threading.Event()

    def give_up():  # JAX's own deadline aborts with a page of C++ stack: one line instead
        if not done.wait(launch.timeout_s):
            print(f"memagent-jax: error: the processes did not all join within "
                  f"{launch.timeout_s} s ({where}): check that every process runs with the "
                  "same --num-processes and that the coordinator's address is reachable "
                  "(--start-timeout to wait longer)", file=sys.stderr, flush=True)
            os._exit(2)

    threading.Thread(target=give_up, daemon=True).start()
    try:
        jax.distributed.initialize(coordinator, count, index, launch.local_device_ids,
                                   initialization_timeout=launch.timeout_s + 60)
        _check_agreement(count, fingerprint, launch.timeout_s)
    except (ValueError, RuntimeError) as e:
        if coordinator is None:
            raise UserError("--distributed (distributed: true) found no cluster to join "
                            "(Cloud TPU VM, SLURM, Open MPI, Kubernetes): give --coordinator, "
                            "--num-processes and --process-id, or JAX_COORDINATOR_ADDRESS, "
                            "JAX_NUM_PROCESSES and JAX_PROCESS_ID") from None
        raise UserError(f"cannot start the distributed job ({where}): "
                        f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    finally:
        done.set()


def reserve_cpu_threads() -> None:
    """Sizes XLA's CPU thread pool so that simulated devices' collectives find threads to run on.

    With N simulated CPU devices (`--xla_force_host_platform_device_count=N` in XLA_FLAGS, or
    JAX_NUM_CPU_DEVICES) XLA runs every device's share of a program on one pool of
    max(cores, N) threads, where the environment variable NPROC, if set, stands for the core
    count. A collective holds its thread until every device has reached it, and XLA may start a
    device's next collective, when independent of the first, before the first ends; with N
    threads one device can then hold two while another device's turn never gets a thread, and
    all of them wait until XLA aborts the process. With 2N threads the programs that deadlocked
    with N run (tests/e2e/test_multiprocess.py). Sets NPROC to 2N unless it is set or the machine
    has the cores; effective only before JAX creates its CPU backend.
    """
    counts = re.findall(r"--xla_force_host_platform_device_count=(\d+)",
                        os.environ.get("XLA_FLAGS", ""))
    counts += re.findall(r"^\s*(\d+)\s*$", os.environ.get("JAX_NUM_CPU_DEVICES", ""))
    devices = max([int(n) for n in counts], default=1)
    if devices > 1 and "NPROC" not in os.environ and (os.cpu_count() or 1) < 2 * devices:
        os.environ["NPROC"] = str(2 * devices)


def cpu_where_no_accelerator() -> None:
    """Sets JAX_PLATFORMS=cpu, unless it is set, on a machine with no accelerator attached:
    no Google TPU on the PCI bus (the test JAX itself makes), no NVIDIA or AMD GPU device
    node. Otherwise JAX would still start the TPU runtime wherever libtpu is installed (the
    test extra installs it), which prints its failure to find a TPU (five lines) on every
    command and in every program that uses the package. Run at the package's import
    (`memagent_jax/__init__.py`); where JAX was imported first, its platforms setting is set
    too (JAX reads the variable at its import), effective until its first device use."""
    if "JAX_PLATFORMS" in os.environ:
        return
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor) as f:
                if f.read().strip() == "0x1ae0":  # Google
                    return
        except OSError:
            continue
    if glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/kfd"):
        return
    os.environ["JAX_PLATFORMS"] = "cpu"
    if "jax" in sys.modules:
        sys.modules["jax"].config.update("jax_platforms", "cpu")


def _coordinates(launch: Launch) -> tuple[str | None, int | None, int | None]:
    """(coordinator, count, index) from the flags, else the environment; all or none."""
    given = {"--coordinator": launch.coordinator, "--num-processes": launch.num_processes,
             "--process-id": launch.process_id}
    if all(v is None for v in given.values()):
        env = {name: os.environ.get(name) for name in _ENV}
        if all(v is None for v in env.values()):
            return None, None, None
        missing = [name for name, v in env.items() if v is None]
        if missing:
            raise UserError(f"{', '.join(missing)} not set: a multi-process job needs all of "
                            f"{', '.join(_ENV)}")
        try:
            count, index = int(env[_ENV[1]]), int(env[_ENV[2]])
        except ValueError:
            raise UserError(f"{_ENV[1]}={env[_ENV[1]]!r}, {_ENV[2]}={env[_ENV[2]]!r}: expected "
                            "integers") from None
        given = {_ENV[0]: env[_ENV[0]], _ENV[1]: count, _ENV[2]: index}
    missing = [name for name, v in given.items() if v is None]
    if missing:
        raise UserError(f"{', '.join(missing)} missing: a multi-process job needs "
                        f"{', '.join(given)}")
    address, count, index = given.values()
    names = list(given)
    if count < 1 or not 0 <= index < count:
        raise UserError(f"{names[2]} {index} is not in 0..{count - 1} ({names[1]} {count})")
    if ":" not in address:
        raise UserError(f"{names[0]} {address!r}: expected HOST:PORT")
    return address, count, index


def _check_agreement(count: int | None, fingerprint: str, timeout_s: int) -> None:
    """Every process publishes what it was told (process count, command line); every process
    reads them all, so a mismatch stops each of them."""
    import jax
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
    told = count or jax.process_count()
    mine = f"{told}|{hashlib.sha256(fingerprint.encode()).hexdigest()[:16]}"
    client.key_value_set(f"memagent_jax/start/{jax.process_index()}", mine)
    told_all = [client.blocking_key_value_get(f"memagent_jax/start/{p}", timeout_s * 1000)
                for p in range(jax.process_count())]
    counts = [int(t.split("|")[0]) for t in told_all]
    if any(c != jax.process_count() for c in counts):
        raise UserError(f"{jax.process_count()} processes joined, but they were told "
                        f"{', '.join(f'process {p}: {c}' for p, c in enumerate(counts))} "
                        "processes: give every process the same --num-processes")
    differing = [p for p, t in enumerate(told_all) if t != told_all[0]]
    if differing:
        raise UserError(f"process(es) {differing} were started differently from process 0 "
                        "(another command, config or flags): every process of a job runs the "
                        "same command line")


# ---- host-side collectives (identity on one process) -------------------------------------

def joined() -> bool:
    """Whether this process is part of a started multi-process job (without loading JAX, or
    starting its backend, where it is not)."""
    state = sys.modules.get("jax._src.distributed")
    return state is not None and state.global_state.client is not None


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
        except Exception as e:  # noqa: BLE001 - reported to every process, then re-raised
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
                        "bucket or a shared file system; README, Pods and clusters)")


class PreemptionNotice:
    """Whether the job has been told to stop: SIGTERM (how TPU VMs and most schedulers announce
    a preemption) or SIGINT (Ctrl-C). While it listens (`with notice:`), either signal sets a
    flag on the process that gets it, and SIGINT also writes `on_interrupt` to that process's
    stderr: the stop comes at the next agreed point, not at once, and a person should know. A
    later signal changes nothing, so that a second Ctrl-C cannot cut short what the first one
    started (a checkpoint being written). `reached()` is called by every process at the same
    points (after each turn and each step) and returns True on all of them at the same call
    once any of them got a signal (an all-gather of the flags); from then on `interrupted`
    says, the same on every process, whether the job stops for a Ctrl-C (any process got
    SIGINT) or a preemption.

    JAX's own preemption sync point is switched off (`start`): Orbax's CheckpointManager asks
    it on every save with its own step numbers, so a second caller counting its own calls
    could miss the point the processes agreed on."""

    _NONE, _SIGTERM, _SIGINT = 0, 1, 2  # a process's flag; the job takes the highest

    def __init__(self, on_interrupt: str = ""):
        self.on_interrupt = on_interrupt
        self.interrupted = False
        self._flag = self._NONE
        self._agreed = self._NONE
        self._previous: dict = {}

    def __enter__(self) -> "PreemptionNotice":
        import signal
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._on_signal)
                              for s in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc) -> None:
        import signal
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _on_signal(self, signum, frame) -> None:
        import signal
        interrupt = signum == signal.SIGINT
        self._flag = max(self._flag, self._SIGINT if interrupt else self._SIGTERM)
        if interrupt and self.on_interrupt:
            # os.write, not print: the handler may run in the middle of another write to
            # sys.stderr (the progress bar's), which print would then refuse as reentrant.
            os.write(2, f"\n{self.on_interrupt}\n".encode())

    @property
    def signal_number(self) -> int:
        """The signal the job stops for, once `reached()`: SIGINT where `interrupted`, else
        SIGTERM (`errors.Interrupted`'s exit status is 128 + it)."""
        import signal
        return signal.SIGINT if self.interrupted else signal.SIGTERM

    def reached(self) -> bool:
        if not self._agreed:
            flag = self._flag
            if joined():
                import numpy as np
                from jax.experimental import multihost_utils
                flag = int(multihost_utils.process_allgather(np.array([flag])).max())
            self._agreed = flag
            self.interrupted = flag == self._SIGINT
        return bool(self._agreed)
