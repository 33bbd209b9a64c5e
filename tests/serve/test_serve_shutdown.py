"""`memagent-jax serve` as a process: SIGTERM or SIGINT under load exits 0 within a bounded
time, stops accepting connections at once, and every request in flight ends either whole or
with an explicit error, never as a cut-off success. And serve refuses a multi-process job."""

import asyncio
import http.client
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from memagent_jax.cli import main
from tests.serve_helpers import API_KEY, serving, wait_healthy

pytestmark = pytest.mark.slow  # servers of their own

LONG = 480  # tokens per long request: 10 of them keep one slot busy for seconds


def _start(model_dir) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen(
        [sys.executable, "-m", "memagent_jax.cli", "serve", "--model", model_dir, "--port", "0",
         "--slots", "1", "--max-len", "512", "--shutdown-timeout", "0.2",
         "--log-level", "warning"],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stderr],
                     daemon=True).start()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            assert process.poll() is None, "serve exited before listening"
            continue
        found = re.search(r"serve: http://127\.0\.0\.1:(\d+)/v1", line)
        if found:
            wait_healthy(f"http://127.0.0.1:{found.group(1)}/v1")
            return process, int(found.group(1))
    process.kill()
    raise TimeoutError("serve did not start within 180 s")


def _ask(port: int, stream: bool, max_tokens: int) -> tuple[str, str]:
    """("complete" | "error" | "refused" | "broken", detail) for one request."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = {"model": "m", "prompt": "hello world", "max_tokens": max_tokens,
            "ignore_eos": True, "stream": stream, "logprobs": 0}
    try:
        connection.request("POST", "/v1/completions", json.dumps(body),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        if not stream:
            payload = json.loads(response.read())
            if response.status == 200:
                whole = (payload["choices"][0]["finish_reason"] == "length"
                         and payload["usage"]["completion_tokens"] == max_tokens)
                return ("complete" if whole else "broken"), str(payload["usage"])
            shut = response.status == 503 and payload["error"]["code"] == "shutting_down"
            return ("error" if shut else "broken"), str(payload)
        events = [line[6:].strip() for line in response.read().decode().splitlines()
                  if line.startswith("data: ")]
        if events and events[-1] == "[DONE]":
            choices = [json.loads(e)["choices"][0] for e in events[:-1]]
            tokens = sum(len(c["logprobs"]["tokens"]) for c in choices if c["logprobs"])
            whole = choices[-1]["finish_reason"] == "length" and tokens == max_tokens
            return ("complete" if whole else "broken"), f"{tokens} tokens"
        last = json.loads(events[-1]) if events else {}
        if "error" in last and last["error"]["code"] == "shutting_down":
            return "error", str(last)
        return "broken", str(events[-3:])
    except ConnectionRefusedError:
        return "refused", ""
    except (OSError, http.client.HTTPException) as e:
        return "broken", repr(e)
    finally:
        connection.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_under_load_ends_every_request_cleanly_and_exits_0(model_dir, signum):
    process, port = _start(model_dir)
    try:
        outcomes: list = []
        clients = [threading.Thread(target=lambda s=stream, n=n: outcomes.append(
            (s, n, *_ask(port, s, n)))) for stream in (True, False)
            for n in (4,) + (LONG,) * 5]
        for client in clients:
            client.start()
            time.sleep(0.02)
        time.sleep(0.1)
        process.send_signal(signum)
        sent = time.monotonic()
        time.sleep(0.3)
        assert _ask(port, False, 4)[0] in ("refused", "broken")  # no new connections
        assert process.wait(timeout=30) == 0
        assert time.monotonic() - sent < 20
        for client in clients:
            client.join(30)
    finally:
        if process.poll() is None:
            process.kill()
    assert len(outcomes) == 12
    assert all(kind in ("complete", "error") for _, _, kind, _ in outcomes), outcomes
    assert any(kind == "error" for _, n, kind, _ in outcomes if n == LONG), outcomes


SHUTDOWN_TIMEOUT, MARGIN_S = 1.0, 3.0


def _health(app) -> int:
    """GET /health's status, asked of the application itself: once shutdown begins, uvicorn
    takes no new connection to ask it over."""
    sent: list = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app({"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                     "method": "GET", "scheme": "http", "path": "/health",
                     "raw_path": b"/health", "query_string": b"", "root_path": "",
                     "headers": [], "server": ("127.0.0.1", 80),
                     "client": ("127.0.0.1", 1)}, receive, send))
    return sent[0]["status"]


@pytest.mark.slow  # a server of its own: ~15 s
def test_at_the_deadline_every_request_in_flight_gets_the_503_and_the_server_stops(
        model_dir, monkeypatch):
    """--shutdown-timeout after shutdown begins, every request still answering ends at once
    with OpenAI's 503 JSON (a stream with its error event): one decoding, one streaming, one
    whose prompt is still being tokenized, and a stream whose sending is held up (as for a
    client that stopped reading), whose job leaves the engine at the deadline all the same;
    the server has stopped within the timeout and MARGIN_S. /health says 503 from the
    moment shutdown begins."""
    from memagent_jax.serve import app, respond

    release, held = threading.Event(), threading.Event()
    check, streamed = respond.check_representable, app.stream

    def stuck(tokenizer, text, what):  # a prompt that takes minutes to tokenize
        if text.startswith("memory"):
            release.wait(60)
        check(tokenizer, text, what)

    async def held_up(exchange, model):  # "the answer"'s events wait until `held` is set
        async for event in streamed(exchange, model):
            yield event
            while exchange.gen.prompts == ("the answer",) and not held.is_set():
                await asyncio.sleep(0.01)

    monkeypatch.setattr(respond, "check_representable", stuck)
    monkeypatch.setattr(app, "stream", held_up)
    outcomes = {}

    def ask(name, port, prompt, stream=False):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        connection.request("POST", "/v1/completions", json.dumps(
            {"model": "m", "prompt": prompt, "max_tokens": LONG, "ignore_eos": True,
             "stream": stream}), {"Content-Type": "application/json",
                                  "Authorization": f"Bearer {API_KEY}"})
        response = connection.getresponse()
        outcomes[name] = (response.status, response.getheader("content-type"),
                          response.read().decode(), time.monotonic())

    try:
        with serving(model_dir, shutdown_timeout=SHUTDOWN_TIMEOUT) as server:
            original, steps = server.worker.engine.generate, []
            monkeypatch.setattr(server.worker.engine, "generate", lambda p, s, n, f=None: (
                steps.append(1), time.sleep(0.02), original(p, s, n, f))[2])  # a reply: ~10 s
            clients = [threading.Thread(target=ask, args=(name, server.port, prompt, stream))
                       for name, prompt, stream in [("decoding", "hello world", False),
                                                    ("streaming", "hello world", True),
                                                    ("held", "the answer", True),
                                                    ("tokenizing", "memory " * 10, False)]]
            # The stuck prompt last: it holds the tokenizing thread the small prompts share,
            # so sent first it would keep the others from ever starting (a loaded machine
            # reorders threads started together).
            for client in clients[:3]:
                client.start()
            deadline = time.monotonic() + 60
            while (server.worker.stats.in_flight < 3 or len(steps) < 20) and (
                    time.monotonic() < deadline):  # the three replies decoding
                time.sleep(0.05)
            clients[3].start()
            time.sleep(0.5)
            try:
                health = [_health(server.app)]
                began = time.monotonic()
                server.shutdown()
                health.append(_health(server.app))
                while server.worker.stats.in_flight and (
                        time.monotonic() < began + SHUTDOWN_TIMEOUT + MARGIN_S):
                    time.sleep(0.01)
                freed = time.monotonic() - began if not server.worker.stats.in_flight else None
            finally:
                held.set()
        stopped = time.monotonic() - began
        for client in clients:
            client.join(30)
    finally:
        release.set()
    assert health == [200, 503]
    assert freed is not None, "a held-up stream's job was still in the engine after the deadline"
    assert SHUTDOWN_TIMEOUT <= freed < SHUTDOWN_TIMEOUT + MARGIN_S
    assert stopped < SHUTDOWN_TIMEOUT + MARGIN_S
    shut = {"message": "The server is shutting down; the request was not finished",
            "type": "server_error", "param": None, "code": "shutting_down"}
    for name in ("decoding", "tokenizing"):
        status, kind, body, at = outcomes[name]
        assert (status, kind, json.loads(body)) == (503, "application/json",
                                                    {"error": shut}), outcomes[name]
        assert SHUTDOWN_TIMEOUT <= at - began < SHUTDOWN_TIMEOUT + MARGIN_S
    for name in ("streaming", "held"):
        status, _, body, _ = outcomes[name]
        events = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
        assert status == 200 and json.loads(events[-1]) == {"error": shut}, outcomes[name]


def test_serve_refuses_a_multi_process_job(model_dir, monkeypatch, capsys):
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    assert main(["serve", "--model", model_dir]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "serve runs on one host for now" in err[0]


def test_serve_without_the_http_stack_says_which_extra(model_dir, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn raises ImportError
    assert main(["serve", "--model", model_dir]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "memagent-jax[serve]" in err[0] and "uvicorn" in err[0]


def test_serve_refuses_a_blank_served_model_name_before_loading(model_dir, capsys):
    assert main(["serve", "--model", model_dir, "--served-model-name", "m", ""]) == 2
    assert capsys.readouterr().err == ("memagent-jax: error: --served-model-name: a name must "
                                       "have a character besides whitespace, got ''\n")


def test_serve_refuses_a_port_beyond_65535_before_loading(model_dir, capsys):
    assert main(["serve", "--model", model_dir, "--port", "99999"]) == 2
    assert capsys.readouterr().err == ("memagent-jax: error: --port must be in 0..65535 (0: any "
                                       "free port), got 99999\n")
