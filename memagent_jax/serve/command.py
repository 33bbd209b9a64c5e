"""`memagent-jax serve`: its flags, the engine behind uvicorn, and how the server stops.

The command loads the model and builds the engine with the factories every command uses
(`engine.factory.load_model_section`, `build_engine`); `OpenAIServer` puts the worker, the app
and uvicorn together on a socket bound before anything is served (port 0: any free one).
Standard library only at import (the CLI builds its parser from this module): JAX, the engine
and the HTTP stack load when the command runs.

Shutdown, on SIGTERM or SIGINT (or `shutdown()` from another thread): uvicorn stops accepting
connections and /health answers 503; requests in flight get `shutdown_timeout` seconds to
finish; then every one still answering (decoding, streaming, or not yet submitted: its body
still arriving, its prompt still tokenizing) ends at once with a 503 error (a stream with an
error event, never [DONE]), so no client takes a cut-off answer for a whole one; the engine
thread stops after its current step, and `run()` returns. A second SIGINT forces the exit.

Single host only: a multi-process job (`JAX_NUM_PROCESSES` > 1) is refused with one line. On a
pod, every process would have to step the engine while process 0 serves HTTP and broadcasts
each step's requests; that is not built yet.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING

from memagent_jax.commandline import add_command, add_model_flags, from_flags, tokens
from memagent_jax.engine.command import model_section  # stdlib-only at import
from memagent_jax.errors import UserError
from memagent_jax.extras import needs

if TYPE_CHECKING:  # annotations only: importing them imports JAX
    from memagent_jax.engine.engine import Engine
    from memagent_jax.engine.factory import LoadedModel


def add_parsers(sub) -> None:
    """Registers `serve` on the CLI's subparsers."""
    p = add_command(sub, "serve", help="an OpenAI-compatible HTTP server on the engine (/v1/"
                                       "chat/completions, /v1/completions, /v1/models)")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="HF, checkpoint or training run directory")
    p.add_argument("--served-model-name", nargs="+", metavar="NAME",
                   help="the names requests use (default: --model as given, and its last "
                        "path component)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="0: any free port")
    p.add_argument("--api-key", help="required of clients (Authorization: Bearer KEY); "
                                     "default: env MEMAGENT_API_KEY (the key `run` sends "
                                     "to a server), else none")
    p.add_argument("--slots", type=int, default=8, help="sequences decoded together")
    p.add_argument("--max-len", type=tokens,
                   help="the longest prompt + reply served, the most KV entries a slot holds "
                        "(default: the model's context window; a step reads only as far as "
                        "the longest request in flight needs)")
    p.add_argument("--prefill-rows", type=int, default=1,
                   help="prompts prefilled together in one call")
    p.add_argument("--max-logprobs", type=int, default=20,
                   help="the most top_logprobs a request may ask (0: no alternatives)")
    p.add_argument("--max-requests", type=int, default=1024,
                   help="requests in flight (decoding or waiting for a slot); more get 429")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish after SIGTERM/SIGINT")
    p.add_argument("--mesh", metavar="AXIS=SIZE,...",
                   help="spread the model over this host's devices, e.g. fsdp=-1,tensor=4 "
                        "(default: one device)")
    p.add_argument("--log-level", default="info",
                   choices=("critical", "error", "warning", "info", "debug"))
    add_model_flags(p)
    p.set_defaults(func=_serve)


def _serve(args) -> None:
    from memagent_jax.engine.engine_api import EngineConfig
    from memagent_jax.engine.factory import build_engine, load_model_section
    from memagent_jax.models.loading import read_config
    from memagent_jax.models.sharding import job_mesh

    check_single_host()
    require_http_stack()
    for flag, value, low in (("--max-logprobs", args.max_logprobs, 0),
                             ("--max-requests", args.max_requests, 1),
                             ("--shutdown-timeout", args.shutdown_timeout, 0)):
        if value < low:
            raise UserError(f"{flag} must be at least {low}, got {value}")
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be in 0..65535 (0: any free port), got {args.port}")
    blank = [name for name in args.served_model_name or () if not name.strip()]
    if blank:  # no request could name it ('model' must be a non-empty string)
        raise UserError(f"--served-model-name: a name must have a character besides "
                        f"whitespace, got {blank[0]!r}")
    model = model_section(args)
    tokenizer = from_flags(model.load_tokenizer, required=True)
    model_config = read_config(model.path)
    max_len = args.max_len or model_config.context_window
    engine_config = from_flags(EngineConfig, slots=args.slots, max_len=args.max_len,
                               prefill_rows=args.prefill_rows,
                               top_logprobs=min(args.max_logprobs, model_config.vocab_size))
    mesh = job_mesh(parse_mesh(args.mesh), source="--mesh")
    loaded = from_flags(load_model_section, section=model, tokenizer=tokenizer, mesh=mesh)
    engine = from_flags(build_engine, model=loaded.model, config=engine_config, mesh=mesh,
                        tokens=max_len, why=f"{max_len} (the model's context window, the "
                                            "default)")
    names = served_names(args.model, args.served_model_name)
    server = OpenAIServer(loaded, engine, names=names, max_len=max_len, host=args.host,
                          port=args.port,
                          # set but empty: no key (a key of "" refuses every client sending one)
                          api_key=args.api_key or os.environ.get("MEMAGENT_API_KEY") or None,
                          max_requests=args.max_requests,
                          shutdown_timeout=args.shutdown_timeout, log_level=args.log_level)
    print(f"memagent-jax serve: {server.url} ({', '.join(names)}; "
          f"{args.slots} slots, {max_len} tokens per request)", file=sys.stderr, flush=True)
    server.run()


def check_single_host() -> None:
    """Raises UserError when the environment starts this process as one of a multi-process
    job (memagent_jax.distributed.startup reads the same variable)."""
    count = os.environ.get("JAX_NUM_PROCESSES", "1")
    if count.strip() not in ("", "1"):
        raise UserError(f"serve runs on one host for now (JAX_NUM_PROCESSES={count}): start "
                        "it as a single process; --mesh spreads the model over that host's "
                        "devices")


def require_http_stack() -> None:
    """Raises MissingExtra (a UserError) unless the `serve` extra (starlette, uvicorn) is
    installed: before the model loads."""
    with needs("serve", "serve"):
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401


def parse_mesh(text: str | None) -> dict[str, int] | None:
    """--mesh "fsdp=-1,tensor=4" -> {"fsdp": -1, "tensor": 4}; None stays None."""
    if not text:
        return None
    axes = {}
    for part in text.split(","):
        name, _, size = part.partition("=")
        try:
            axes[name.strip()] = int(size)
        except ValueError:
            raise UserError(f"--mesh: expected AXIS=SIZE,... such as fsdp=-1,tensor=4, got "
                            f"{text!r}") from None
    return axes


def served_names(model: str, extra: list[str] | None) -> tuple[str, ...]:
    """The names requests may use: --served-model-name's, else the --model argument as given
    (what vLLM serves it as, and what MemAgent's quickstart sends) and its last path component
    (what MemAgent's llm070.py serves and its eval scripts send)."""
    if extra:
        return tuple(dict.fromkeys(extra))
    base = os.path.basename(os.path.normpath(model))
    return tuple(dict.fromkeys([model, base]))


class OpenAIServer:
    """The server for one loaded model. max_len: the longest prompt + reply served (the
    engine's KV length may round it up); max_requests: requests in flight (decoding or
    waiting for a slot) before new ones get 429."""

    def __init__(self, loaded: LoadedModel, engine: Engine, *, names: tuple[str, ...],
                 max_len: int, host: str = "127.0.0.1", port: int = 8000,
                 api_key: str | None = None, max_requests: int = 1024,
                 shutdown_timeout: float = 30.0, log_level: str = "info"):
        with needs("serve", "serve"):
            import uvicorn

        from memagent_jax.serve.app import build_app
        from memagent_jax.serve.encoding import Encoder
        from memagent_jax.serve.respond import Served
        from memagent_jax.serve.worker import EngineWorker

        self.shutdown_timeout = shutdown_timeout
        # The decode step and the shortest prompt bucket compile now, not on the first
        # request; longer buckets compile when first used.
        params = engine.place(loaded.params)  # once: every request decodes with this copy
        engine.warm_up(params, [1])
        self.worker = EngineWorker(engine, params, max_requests)
        self.encoder = Encoder(loaded.tokenizer, max_len)
        served = Served(self.worker, loaded.tokenizer, names, max_len, loaded.stop_ids,
                        engine.config.top_logprobs, loaded.config.vocab_size, self.encoder)
        self._served = served
        self.app = build_app(served, api_key, on_startup=self.worker.start,
                             on_shutdown=self._stop_worker)
        self.app.state.created = int(time.time())
        self.socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((host, port))
        except OSError as e:
            self.socket.close()
            raise UserError(f"cannot listen on {host}:{port}: {e.strerror}") from None
        self.port = self.socket.getsockname()[1]
        self.url = f"http://{host}:{self.port}/v1"
        # uvicorn's own limit, a backstop: past it, it cancels the requests left (a plain-text
        # 500 and a traceback), which the deadline at shutdown_timeout leaves none of.
        config = uvicorn.Config(self.app, log_level=log_level,
                                timeout_graceful_shutdown=math.ceil(shutdown_timeout) + 10)
        self._uvicorn = _uvicorn_server(config, self._begin_shutdown)
        self._abort_timer: threading.Timer | None = None

    def run(self) -> None:
        """Serves until SIGTERM/SIGINT (on the main thread) or `shutdown()`; returns once
        every request has been answered or aborted and the engine thread has stopped."""
        main = threading.current_thread() is threading.main_thread()
        # uvicorn raises the signal that stopped it again once it is done, under the handlers
        # it found: these, so that a requested shutdown exits 0 rather than dying of it.
        previous = ({s: signal.signal(s, lambda *_: None) for s in (signal.SIGINT,
                                                                    signal.SIGTERM)}
                    if main else {})
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self._abort_timer is not None:
                self._abort_timer.cancel()
            self.encoder.close()
            self.socket.close()

    def shutdown(self) -> None:
        """What SIGTERM does, from any thread."""
        self._begin_shutdown()
        self._uvicorn.should_exit = True

    def _begin_shutdown(self) -> None:
        if self.app.state.draining:
            return
        self.app.state.draining = True
        self._abort_timer = threading.Timer(self.shutdown_timeout, self._end_requests)
        self._abort_timer.daemon = True
        self._abort_timer.start()

    def _end_requests(self) -> None:
        """The deadline: the worker takes no more jobs and aborts its own; every request
        still answering ends with a 503 on the event loop, not after the engine's step."""
        from memagent_jax.serve.respond import end_requests
        self.worker.abort_all("shutdown")
        loop = getattr(self.app.state, "loop", None)
        if loop is not None:  # else uvicorn never started: nothing to answer
            # RuntimeError: the loop has closed, every request was answered.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(end_requests, self._served)

    def _stop_worker(self) -> None:
        if not self.worker.stop(timeout=60):
            print("memagent-jax serve: the engine thread did not stop within 60 s",
                  file=sys.stderr)


def _uvicorn_server(config, on_exit):
    """A uvicorn.Server that calls on_exit() (our drain) when a signal stops it."""
    with needs("serve", "serve"):
        import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            on_exit()
            super().handle_exit(sig, frame)

    return Server(config)
