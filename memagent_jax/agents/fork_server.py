"""A fork server for Python agent programs (`agent.preload`, agents/program.py): one process of
the program's own interpreter imports the preloaded modules once, then forks a child per
rollout that runs the program as `python SCRIPT ARGS` (or `-m MODULE`, `-c CODE`) would, with
the rollout's environment, standard input and standard error. A program whose imports cost a
second (the `openai` client's ~1 s of CPU, the Agents SDK's ~3 s) then costs its own work.

This file is also the server's source (`python -c <this file> PATH0 MODULE...`), so it imports
the standard library only: the program's interpreter need not have memagent_jax.

The protocol, one JSON object a line: a request `{"id", "argv", "env", "cwd", "stdin",
"stderr"}` (the program's arguments after the interpreter, its environment and working
directory, a file it reads as standard input, a file its standard error goes to; its standard
output goes to /dev/null); the server answers `{"id", "pid"}` when the child starts and `{"id",
"status"}` when it ends (its exit status, or minus the signal that ended it). At the end of
its input (the client closed it, or its process ended) the server kills its children and
exits. A forked program differs from a spawned one only in what it cannot see: the
preloaded modules are already in `sys.modules`, with the state their import left (the
`random` module is reseeded in every child; other generators are not), and every child has
the server's hash seed (a set of strings iterates in one order in every rollout).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable
from typing import NoReturn


def serve(path0: str, preload: list[str]) -> None:
    """The server (module docstring) on standard input and output; `path0` is `sys.path[0]` as
    the command would set it (where the preloaded modules are found, as the program finds
    them)."""
    import importlib
    import selectors
    channel_in, channel_out = os.dup(0), os.dup(1)
    quiet = os.open(os.devnull, os.O_RDWR)  # what a preloaded module prints is not an answer
    os.dup2(quiet, 0)
    os.dup2(quiet, 1)
    os.close(quiet)
    sys.path[0] = path0
    for name in preload:
        importlib.import_module(name)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector below
    children: dict[int, str] = {}
    selector = selectors.DefaultSelector()
    selector.register(channel_in, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    pending, done = b"", False

    def send(message: dict) -> None:
        with contextlib.suppress(OSError):  # the client is gone (it reads no more)
            os.write(channel_out, (json.dumps(message) + "\n").encode())

    while not done or children:
        for key, _ in selector.select():
            if key.fd == wake_read:
                os.read(wake_read, 4096)
                continue
            data = os.read(channel_in, 65536)
            if not data:  # the client is gone: so are its programs
                done = True
                selector.unregister(channel_in)
                for pid in children:
                    kill(pid)
                continue
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:  # the program; it leaves by the interpreter's own exit
                    _child(request, (channel_in, channel_out, wake_read, wake_write))
                with contextlib.suppress(OSError):  # (the child does too: whoever is first)
                    os.setpgid(pid, pid)
                children[pid] = request["id"]
                send({"id": request["id"], "pid": pid})
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            if pid in children:
                send({"id": children.pop(pid), "status": os.waitstatus_to_exitcode(status)})


def _child(request: dict, inherited: tuple[int, ...]) -> NoReturn:
    """Runs the program in the forked child, then raises SystemExit with its status, so that
    the interpreter's own exit follows as after `python SCRIPT`: it waits for the program's
    threads, runs its `atexit` functions, collects its objects (files flush) and flushes the
    streams. An uncaught exception is printed by `sys.excepthook` from the program's frames
    on, and the status is 1."""
    import builtins
    import runpy
    import types
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        with contextlib.suppress(OSError):  # its own processes die with it at a deadline
            os.setpgid(0, 0)
        for fd, path, flags in ((0, request["stdin"], os.O_RDONLY),
                                (1, os.devnull, os.O_WRONLY),
                                (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            opened = os.open(path, flags, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        for fd in inherited:
            os.close(fd)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's own streams)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False, buffering=1,  # noqa: SIM115
                          errors="backslashreplace")
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        argv = request["argv"]
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy._run_module_as_main(argv[1])  # type: ignore[attr-defined]  # python -m's own
        else:
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = builtins
            if argv[0] == "-c":
                sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
                code = compile(argv[1], "<string>", "exec")
            else:
                sys.argv, sys.path[0] = list(argv), os.path.dirname(os.path.realpath(argv[0]))
                main.__dict__["__file__"] = argv[0]
                with open(argv[0], "rb") as f:
                    code = compile(f.read(), argv[0], "exec")
            sys.modules["__main__"] = main
            exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as e:
        sys.excepthook(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None)
        raise SystemExit(1) from None
    raise SystemExit(0)


def kill(pid: int) -> None:
    """Kills a child the server started, and the processes it started (its process group:
    the server makes it before it answers with the pid)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


class ForkServer:
    """The client: `start(...)` asks the server for a child; a thread reads its answers and
    calls `on_start(pid)` and `on_exit(status)` from that thread (the callers hand them to
    their event loop). Not tied to an event loop, so one server serves a run whose steps each
    run their own. If the server dies, its children still running are killed, the callbacks
    it still owes get None and `error` says how it ended. The server ends when this object is
    collected (its input closes) or at `stop()`."""

    def __init__(self, python: str, path0: str, preload: tuple[str, ...]):
        with open(__file__) as f:
            source = f.read()
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 (read when the server ends)
        self._process = subprocess.Popen(
            [python, "-c", source, path0, *preload], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._errors, start_new_session=True)
        self._state = _State()
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        # Requests are written by a thread of their own: a server still importing reads none,
        # and a full pipe must not block the caller's event loop.
        threading.Thread(target=_write, args=(self._process, self._requests), daemon=True,
                         name="fork-server-requests").start()
        threading.Thread(target=_read, args=(self._process, self._errors, self._state),
                         daemon=True, name="fork-server-answers").start()
        weakref.finalize(self, self._requests.put, None)

    @property
    def error(self) -> str | None:
        return self._state.error

    def stop(self) -> None:
        """Kills the server (one that no longer answers); what it owes is settled as for a
        death."""
        kill(self._process.pid)

    def start(self, argv: list[str], env: dict, cwd: str, stdin: str, stderr: str,
              on_start: Callable[[int | None], None],
              on_exit: Callable[[int | None], None]) -> None:
        state = self._state
        with state.lock:
            ended = state.ended
            if not ended:
                state.next += 1
                key = str(state.next)
                state.waiting[key] = [on_start, on_exit, None]
                self._requests.put({"id": key, "argv": argv, "env": env, "cwd": cwd,
                                    "stdin": stdin, "stderr": stderr})
        if ended:
            on_start(None)
            on_exit(None)


class _State:
    def __init__(self):
        self.lock = threading.Lock()
        self.waiting: dict[str, list] = {}  # id -> [on_start, on_exit, pid once started]
        self.next = 0
        self.ended = False
        self.error: str | None = None


def _write(process: subprocess.Popen, requests: queue.SimpleQueue) -> None:
    """Writes the requests to the server until None (the client is gone) or its end."""
    assert process.stdin is not None
    with contextlib.suppress(OSError):  # the server is gone: `_read` settles what waits
        while (request := requests.get()) is not None:
            process.stdin.write((json.dumps(request) + "\n").encode())
            process.stdin.flush()
    with contextlib.suppress(OSError):
        process.stdin.close()


def _read(process: subprocess.Popen, errors, state: _State) -> None:
    """The server's answers, to the callbacks that wait on them, until it ends; then its
    children still running are killed and what it owes is settled with None."""
    assert process.stdout is not None
    try:
        for line in process.stdout:
            message = json.loads(line)
            with state.lock:
                waiting = state.waiting[message["id"]]
                if "status" in message:
                    del state.waiting[message["id"]]
                else:
                    waiting[2] = message["pid"]
            if "pid" in message:
                waiting[0](message["pid"])
            else:
                waiting[1](message["status"])
    finally:
        status = process.wait()
        errors.seek(0)
        lines = errors.read().decode(errors="replace").strip().splitlines()
        state.error = (f"exited with status {status}" if status >= 0 else
                       f"was killed (signal {-status})") + (f": {lines[-1][:300]}" if lines
                                                            else "")
        with state.lock:
            state.ended = True
            owed, state.waiting = state.waiting, {}
        for on_start, on_exit, pid in owed.values():
            if pid is None:
                on_start(None)
            else:
                kill(pid)
            on_exit(None)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
