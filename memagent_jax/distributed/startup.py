"""Joining this process to its job, and setting up JAX's CPU backend before JAX starts.

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
of the command line; `check_agreement`), so a job started with mismatched flags stops at once,
on every process. On CPU the collectives go through gloo, and simulated CPU devices get twice
their number of threads (`reserve_cpu_threads`). `cpu_where_no_accelerator` runs earlier
still, at the package's import.

After `start()`, `jax.process_index()`/`process_count()` say who is who, `joined()` whether
this process is part of a multi-process job. JAX's private distributed state is read in one
place, `coordination_client()`.

Standard library only at import (JAX loads inside the functions): the command modules and
`memagent_jax/__init__.py` import this module.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import re
import sys
import threading
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

    if joined():
        return
    coordinator, count, index = _coordinates(launch)
    if coordinator is None and not launch.auto:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_enable_preemption_service", False)  # see preemption.py
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
        check_agreement(count, fingerprint, launch.timeout_s)
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
    names: tuple[str, ...] = ("--coordinator", "--num-processes", "--process-id")
    address, count, index = launch.coordinator, launch.num_processes, launch.process_id
    if address is None and count is None and index is None:
        env = {name: os.environ[name] for name in _ENV if name in os.environ}
        if not env:
            return None, None, None
        missing = [name for name in _ENV if name not in env]
        if missing:
            raise UserError(f"{', '.join(missing)} not set: a multi-process job needs all of "
                            f"{', '.join(_ENV)}")
        try:
            count, index = int(env[_ENV[1]]), int(env[_ENV[2]])
        except ValueError:
            raise UserError(f"{_ENV[1]}={env[_ENV[1]]!r}, {_ENV[2]}={env[_ENV[2]]!r}: expected "
                            "integers") from None
        names, address = _ENV, env[_ENV[0]]
    if address is None or count is None or index is None:
        missing = [name for name, v in zip(names, (address, count, index)) if v is None]
        raise UserError(f"{', '.join(missing)} missing: a multi-process job needs "
                        f"{', '.join(names)}")
    if count < 1 or not 0 <= index < count:
        raise UserError(f"{names[2]} {index} is not in 0..{count - 1} ({names[1]} {count})")
    if ":" not in address:
        raise UserError(f"{names[0]} {address!r}: expected HOST:PORT")
    return address, count, index


def check_agreement(count: int | None, fingerprint: str, timeout_s: int) -> None:
    """Returns once every process of the job was told the same process count and the same
    `fingerprint`, else raises UserError on every process (the first mismatch named: the
    count, else which processes differ from process 0). count: what this process was told
    (None: auto-detection, whose count is the job's own). Each process publishes its count and
    a hash of its fingerprint in the coordination service's key-value store, then reads every
    process's, waiting up to `timeout_s` for each (a read that times out raises JAX's error).
    Called by `start` once JAX has joined the processes; needs `coordination_client()`."""
    import jax

    client = coordination_client()
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


def joined() -> bool:
    """Whether this process is part of a started multi-process job (without loading JAX, or
    starting its backend, where it is not)."""
    return coordination_client() is not None


def coordination_client() -> Any:
    """JAX's client of the job's coordination service once `jax.distributed.initialize` has
    joined this process to a job (and until `jax.distributed.shutdown`), else None. Imports
    nothing: where JAX's distributed module was never loaded no job was joined, so the answer
    is None without loading JAX.

    The one read of JAX's private state (`jax._src.distributed.global_state.client`), for what
    public JAX lacks: `jax.distributed` (initialize, is_initialized, shutdown) gives no handle
    on the coordination service's key-value store (`key_value_set`, `blocking_key_value_get`),
    through which `check_agreement` compares what the processes were told, each read bounded
    by a timeout, before any device collective runs; and `jax.distributed.is_initialized`
    needs JAX imported, which `joined` must not do where the process never loaded it."""
    state = sys.modules.get("jax._src.distributed")
    return None if state is None else state.global_state.client
