"""`memagent-jax serve`: an OpenAI-compatible HTTP server on the decoding engine.

MemAgent's own tools (its quickstart, its RULER-HQA and RULER evaluation scripts) drive a model
through `/v1/chat/completions`, as vLLM serves it; this package serves our engine the same way.

    protocol.py  request bodies -> `Generation` (every field checked; `APIError` is OpenAI's
                 error JSON with its HTTP status)
    encoding.py  prompts -> token ids off the event loop, a large prompt on a thread of its
                 own, one beyond any that fits refused before it is tokenized
    text.py      one choice's tokens -> text deltas, stop strings applied
    worker.py    the engine's thread: one `Scheduler` stepping continuously, requests in and
                 cancellations through a queue, a bound on requests in flight
    respond.py   a `Generation` run on the worker -> OpenAI's response objects and stream
                 chunks (chat and completions)
    app.py       the Starlette application: routes, API key, errors, disconnects
    command.py   the `serve` command: model, engine, worker, uvicorn, graceful shutdown

The HTTP stack (starlette, uvicorn) is the `serve` extra and is imported only here.
"""
