"""Runs a command as a job of N JAX processes on this machine, as a pod would run it.

Each process is `python -m memagent_jax.cli ARGS` (or `python -c CODE`) with 4 CPU devices,
JAX_COORDINATOR_ADDRESS on a free loopback port, JAX_NUM_PROCESSES and JAX_PROCESS_ID, gloo
collectives (chosen by `memagent_jax.distributed.startup.start`), all started together and
bounded in time: processes still running at the deadline are killed and the test fails with
their output.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every test process compiles with LLVM's optimisations off: XLA's own passes (fusion, layout,
# sharding) still run, so the programs are the ones the product runs; the tests' tiny models
# take far longer to compile than to run.
COMPILE_FLAGS = "--xla_backend_optimization_level=0"


@dataclasses.dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(process_id: int = 0, num_processes: int = 1, port: int = 0,
                devices: int = 4) -> dict:
    """Process process_id's environment in a job of num_processes (one: a lone child process,
    e.g. `environment(devices=1)`), its coordinator on loopback port."""
    env = dict(os.environ)
    env.update(JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               # XLA:CPU aborts a collective that waits 40 s for a device's thread; beside
               # another test worker on 2 cores one came late (CI, 2026-11-27): let it wait,
               # within every job's bound.
               XLA_FLAGS=f"{COMPILE_FLAGS} --xla_force_host_platform_device_count={devices}"
                         " --xla_cpu_collective_call_terminate_timeout_seconds=240",
               PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
    if num_processes > 1:
        env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                   JAX_NUM_PROCESSES=str(num_processes), JAX_PROCESS_ID=str(process_id))
    else:
        for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
            env.pop(name, None)
    return env


def start(args: list[str], num_processes: int = 2, devices: int = 4, cwd: str | None = None,
          env_for=None) -> list[subprocess.Popen]:
    """The job's processes, started. args: the CLI's arguments, or ["-c", CODE]. env_for(i,
    env) may edit process i's environment."""
    port = free_port()
    command = [sys.executable] + (args if args[:1] == ["-c"]
                                  else ["-m", "memagent_jax.cli", *args])
    processes = []
    for i in range(num_processes):
        env = environment(i, num_processes, port, devices)
        if env_for is not None:
            env_for(i, env)
        processes.append(subprocess.Popen(command, cwd=cwd or ROOT, env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return processes


def wait(processes: list[subprocess.Popen], timeout_s: float) -> list[Finished]:
    """Each process's exit status and output; kills them all at the deadline and raises."""
    deadline = time.monotonic() + timeout_s
    results = []
    try:
        for p in processes:
            out, err = p.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            results.append(Finished(p.returncode, out, err))
    except subprocess.TimeoutExpired:
        outputs = []
        for p in processes:
            p.kill()
            out, err = p.communicate()
            outputs.append(f"--- process stdout:\n{out[-2000:]}\n--- stderr:\n{err[-4000:]}")
        raise AssertionError(f"the job ran past {timeout_s} s:\n" + "\n".join(outputs)) from None
    return results


def run(args: list[str], num_processes: int = 2, timeout_s: float = 300, **kwargs
        ) -> list[Finished]:
    """start() then wait()."""
    return wait(start(args, num_processes, **kwargs), timeout_s)


def check_ok(results: list[Finished]) -> None:
    failed = [(i, r) for i, r in enumerate(results) if r.returncode != 0]
    assert not failed, "\n".join(f"process {i} exited {r.returncode}:\n{r.stderr[-6000:]}"
                                 for i, r in failed)
