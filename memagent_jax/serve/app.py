"""The HTTP application (Starlette, an ASGI framework; uvicorn serves it): routes, API key,
errors.

    GET  /health                 200 while serving, 503 once shutting down
    GET  /metrics                Prometheus text: requests, slots busy (and their peak), steps
    GET  /v1/models              the served model under each of its names
    POST /v1/chat/completions    messages through the chat template
    POST /v1/completions         text or token-id prompts

With an API key set, /v1/ routes need `Authorization: Bearer KEY` (or Azure's `api-key: KEY`,
which MemAgent's quickstart sends too). Every error is OpenAI's JSON with its status: 400 bad
request, 401 wrong key, 404 unknown model or route, 429 too many requests in flight, 500 engine
failure, 503 shutting down; the server keeps serving after any of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from collections.abc import Callable

from memagent_jax.extras import needs
from memagent_jax.serve.protocol import APIError, Generation, bad, parse_chat, parse_completion
from memagent_jax.serve.respond import (
    Aborted,
    Exchange,
    Served,
    abort_error,
    collect,
    prepare,
    stream,
    unless_ended,
)

with needs("serve", "serve"):
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route


def build_app(served: Served, api_key: str | None, on_startup=None, on_shutdown=None
              ) -> Starlette:
    """The application over `served`. on_startup / on_shutdown: called as uvicorn starts and
    after the last connection has closed (the command starts and stops the worker there)."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        app.state.loop = asyncio.get_running_loop()  # for `end_requests` from other threads
        if on_startup is not None:
            on_startup()
        try:
            yield
        finally:
            if on_shutdown is not None:
                on_shutdown()

    async def health(request: Request):
        if request.app.state.draining:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request):
        stats = served.worker.stats
        lines = []
        for name, value, kind in [
                ("requests_total", stats.requests_total, "counter"),
                ("requests_in_flight", stats.in_flight, "gauge"),
                ("slots_total", served.worker.engine.config.slots, "gauge"),
                ("slots_busy", stats.busy_slots, "gauge"),
                ("slots_busy_peak", stats.busy_slots_peak, "gauge"),
                ("decode_steps_total", stats.decode_steps_total, "counter"),
                ("generated_tokens_total", stats.tokens_total, "counter")]:
            lines += [f"# TYPE memagent_{name} {kind}", f"memagent_{name} {value}"]
        return PlainTextResponse("\n".join(lines) + "\n")

    async def models(request: Request):
        _authorize(request, api_key)
        created = request.app.state.created
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "memagent-jax",
             "max_model_len": served.max_len} for name in served.names]})

    async def chat(request: Request):
        _authorize(request, api_key)
        return await _answer(served, request,
                             lambda body: parse_chat(body, served.max_top_logprobs))

    async def completions(request: Request):
        _authorize(request, api_key)
        return await _answer(served, request, lambda body: parse_completion(
            body, served.max_top_logprobs, served.vocab_size))

    app = Starlette(
        routes=[Route("/health", health), Route("/metrics", metrics),
                Route("/v1/models", models),
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/v1/completions", completions, methods=["POST"])],
        # Starlette types every handler as taking any Exception; each here takes its own.
        exception_handlers={APIError: _api_error,  # type: ignore[dict-item]
                            HTTPException: _http_error,  # type: ignore[dict-item]
                            Exception: _server_error},
        lifespan=lifespan)
    app.state.draining = False
    app.state.created = 0
    return app


async def _answer(served: Served, request: Request, parse: Callable[[object], Generation]):
    """The response to a request whose JSON body `parse` reads. Until its jobs are submitted
    (its body read, its prompts tokenized) it ends with shutdown's 503 at the deadline."""
    gen = parse(await unless_ended(served, _body(request)))
    if gen.model not in served.names:
        raise APIError(404, f"The model `{gen.model}` does not exist (served: "
                            f"{', '.join(served.names)})", "model", "model_not_found")
    prompts = await unless_ended(served, prepare(served, gen))
    exchange = Exchange(served, gen, prompts, request.receive)
    if gen.stream:
        return StreamingResponse(stream(exchange, gen.model), media_type="text/event-stream",
                                 background=BackgroundTask(exchange.close))
    try:
        return JSONResponse(await collect(exchange, gen.model))
    except Aborted as e:  # "disconnected": this answer reaches nobody
        raise abort_error(str(e)) from None


def _authorize(request: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    given = request.headers.get("api-key") or ""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        given = token.strip()
    if not hmac.compare_digest(given.encode(), api_key.encode()):
        raise APIError(401, "Incorrect API key provided" if given else
                       "You didn't provide an API key (Authorization: Bearer KEY)",
                       code="invalid_api_key")


async def _body(request: Request):
    try:
        raw = await request.body()
    except ClientDisconnect:  # answered to nobody: uvicorn logs the one access line
        raise bad("the client closed the connection before sending the whole body") from None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad(f"We could not parse the JSON body of your request ({e}). The body must be "
                  "JSON, sent with Content-Type: application/json") from None


async def _api_error(request: Request, error: APIError):
    return JSONResponse(error.body(), status_code=error.status)


async def _http_error(request: Request, error: HTTPException):
    return JSONResponse(APIError(error.status_code, f"{request.method} {request.url.path}: "
                                                    f"{error.detail}").body(),
                        status_code=error.status_code)


async def _server_error(request: Request, error: Exception):
    return JSONResponse(APIError(500, f"internal error: {type(error).__name__}: {error}",
                                 kind="server_error").body(), status_code=500)
