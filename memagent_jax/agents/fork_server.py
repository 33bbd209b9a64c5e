"""A fork server for Python agent programs (`agent.preload`, agents/program.py): one process of
the program's own interpreter imports the preloaded modules once, then forks a child per
rollout that runs the program as `python SCRIPT ARGS` (or `-m MODULE`, `-c CODE`) would, with
the rollout's environment, standard input and standard error. A program whose imports cost a
second (the `openai` client's ~1 s of CPU, the Agents SDK's ~3 s) then costs its own work.

This file is also the server's source (`python -c <this file> MODULE...`), so it imports the
standard library only: the program's interpreter need not have memagent_jax.

The protocol, one JSON object a line: a request `{"id", "argv", "env", "cwd", "stdin",
"stderr"}` (the program's arguments after the interpreter, its environment and working
directory, a file it reads as standard input, a file its standard error goes to; its standard
output goes to /dev/null); the server answers `{"id", "pid"}` when the child starts and `{"id",
"status"}` when it ends (its exit status, or minus the signal that ended it). At the end of
its input (the client closed it, or its process ended) the server kills its children and
exits. A forked program differs from a spawned one only in what it cannot see: the
preloaded modules are already in `sys.modules`, with the state their import left (the
`random` module is reseeded in every child; other generators are not).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable


def serve(preload: list[str]) -> None:
    """The server (module docstring) on standard input and output."""
    import importlib
    import selectors
    channel_in, channel_out = os.dup(0), os.dup(1)
    quiet = os.open(os.devnull, os.O_RDWR)  # what a preloaded module prints is not an answer
    os.dup2(quiet, 0)
    os.dup2(quiet, 1)
    os.close(quiet)
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
                if pid == 0:
                    os._exit(_child(request, (channel_in, channel_out, wake_read, wake_write)))
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


def _child(request: dict, inherited: tuple[int, ...]) -> int:
    """Runs the program in the forked child; its exit status (SystemExit's, 1 after an
    uncaught exception, printed as the interpreter prints it)."""
    import atexit
    import runpy
    import traceback
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    with contextlib.suppress(OSError):  # the program's own processes die with it at a deadline
        os.setpgid(0, 0)
    for fd, path, flags in ((0, request["stdin"], os.O_RDONLY), (1, os.devnull, os.O_WRONLY),
                            (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    for fd in inherited:
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's own streams)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False, buffering=1, errors="backslashreplace")  # noqa: SIM115
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = request["argv"]
    status = 0
    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        elif argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            status = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException as e:  # printed from the program's frames on, as Python prints it
        frames = e.__traceback__.tb_next if e.__traceback__ else None
        while frames and frames.tb_frame.f_code.co_filename in (runpy.__file__,
                                                                "<frozen runpy>"):
            frames = frames.tb_next
        traceback.print_exception(type(e), e, frames)
        status = 1
    try:
        for thread in threading.enumerate():  # as the interpreter's exit waits for them
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        traceback.print_exc()
        status = status or 1
    return status


def kill(pid: int) -> None:
    """Kills a child the server started, and the processes it started."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:  # a group of its own not made yet (or gone): the child alone
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class ForkServer:
    """The client: `start(...)` asks the server for a child; a thread reads its answers and
    calls `on_start(pid)` and `on_exit(status)` from that thread (the callers hand them to
    their event loop). Not tied to an event loop, so one server serves a run whose steps each
    run their own. If the server dies, the callbacks it still owes get None and `error` says
    how it ended. The server ends when this object is collected (its input closes)."""

    def __init__(self, python: str, preload: tuple[str, ...]):
        with open(__file__) as f:
            source = f.read()
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 (read when the server ends)
        self._process = subprocess.Popen(
            [python, "-c", source, *preload], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._errors, start_new_session=True)
        self._state = _State()
        threading.Thread(target=_read, args=(self._process, self._errors, self._state),
                         daemon=True, name="fork-server").start()
        weakref.finalize(self, _close, self._process)

    @property
    def error(self) -> str | None:
        return self._state.error

    def start(self, argv: list[str], env: dict, cwd: str, stdin: str, stderr: str,
              on_start: Callable[[int | None], None],
              on_exit: Callable[[int | None], None]) -> None:
        assert self._process.stdin is not None
        state = self._state
        with state.lock:
            ended = state.ended
            if not ended:
                state.next += 1
                key = str(state.next)
                state.waiting[key] = [on_start, on_exit, False]
                request = {"id": key, "argv": argv, "env": env, "cwd": cwd, "stdin": stdin,
                           "stderr": stderr}
                try:
                    self._process.stdin.write((json.dumps(request) + "\n").encode())
                    self._process.stdin.flush()
                except OSError:  # the server is gone: `_read` ends what waits on it
                    ended = True
        if ended:  # (the callers' callbacks take a second call)
            on_start(None)
            on_exit(None)


class _State:
    def __init__(self):
        self.lock = threading.Lock()
        self.waiting: dict[str, list] = {}  # id -> [on_start, on_exit, started]
        self.next = 0
        self.ended = False
        self.error: str | None = None


def _read(process: subprocess.Popen, errors, state: _State) -> None:
    """The answers of the server, to the callbacks that wait on them, until it ends."""
    assert process.stdout is not None
    for line in process.stdout:
        message = json.loads(line)
        with state.lock:
            waiting = state.waiting[message["id"]]
            if "status" in message:
                del state.waiting[message["id"]]
            else:
                waiting[2] = True
        if "pid" in message:
            waiting[0](message["pid"])
        else:
            waiting[1](message["status"])
    errors.seek(0)
    lines = errors.read().decode(errors="replace").strip().splitlines()
    state.error = f"exited with status {process.wait()}" + (f": {lines[-1][:300]}" if lines
                                                           else "")
    with state.lock:
        state.ended = True
        owed, state.waiting = state.waiting, {}
    for on_start, on_exit, started in owed.values():
        if not started:
            on_start(None)
        on_exit(None)


def _close(process: subprocess.Popen) -> None:
    if process.stdin is not None:
        process.stdin.close()


if __name__ == "__main__":
    serve(sys.argv[1:])
