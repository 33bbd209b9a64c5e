"""`memagent-jax serve` under bad requests and load: each bad request gets its 4xx with
OpenAI's error JSON and the next request is served; a client that disconnects frees its slot
at once; a full queue answers 429; 64 concurrent clients with prompts of mixed lengths each get
their own answer (equal to `generate`'s), with bad requests mixed in, while the engine
batches them."""

import asyncio
import http.client
import json
import logging
import socket
import threading
import time

import openai
import pytest

from tests.serve_helpers import (
    API_KEY,
    MAX_LEN,
    SLOTS,
    client_of,
    generate,
    get,
    ids_of,
    serving,
)

pytestmark = pytest.mark.slow  # a server under load of its own

GOOD = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def server(model_dir):
    with serving(model_dir) as server:
        yield server


def request(server, path, body=None, key=API_KEY, method="POST"):
    """(status, decoded JSON body) of one request on its own connection."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    try:
        connection.request(method, path, data, headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def metric(server, name) -> int:
    text = get(server.url.removesuffix("/v1") + "/metrics")
    return int(next(line.split()[1] for line in text.splitlines()
                    if line.startswith(f"memagent_{name} ")))


CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                       "properties": {}}}}]


@pytest.mark.parametrize("path, body, key, status, param, code", [
    (CHAT, b'{"model": "m", "messages": [', API_KEY, 400, None, None),  # malformed JSON
    (CHAT, b'[1, 2]', API_KEY, 400, None, None),
    (CHAT, {**GOOD, "model": "gpt-4"}, API_KEY, 404, "model", "model_not_found"),
    (CHAT, {**GOOD, "messages": []}, API_KEY, 400, "messages", None),
    (CHAT, {**GOOD, "messages": [{"role": "robot", "content": "x"}]}, API_KEY, 400,
     "messages[0]", None),
    (CHAT, {**GOOD, "max_tokens": -5}, API_KEY, 400, "max_tokens", None),
    (CHAT, {**GOOD, "max_tokens": MAX_LEN}, API_KEY, 400, "messages",
     "context_length_exceeded"),
    (COMPLETIONS, {"model": "m", "prompt": [3] * (MAX_LEN + 10)}, API_KEY, 400, "prompt",
     "context_length_exceeded"),
    (COMPLETIONS, {"model": "m", "prompt": [3, 4, 500]}, API_KEY, 400, "prompt", None),
    (COMPLETIONS, {"model": "m", "prompt": ""}, API_KEY, 400, "prompt", None),
    (CHAT, {**GOOD, "temperature": -1}, API_KEY, 400, "temperature", None),
    (CHAT, {**GOOD, "top_p": 0}, API_KEY, 400, "top_p", None),
    (CHAT, {**GOOD, "n": 0}, API_KEY, 400, "n", None),
    (CHAT, {**GOOD, "logprobs": True, "top_logprobs": 6}, API_KEY, 400, "top_logprobs", None),
    (CHAT, {**GOOD, "top_logprobs": 2}, API_KEY, 400, "top_logprobs", None),
    (CHAT, {**GOOD, "stop": [""]}, API_KEY, 400, "stop", None),
    (CHAT, {**GOOD, "presence_penalty": 0.5}, API_KEY, 400, "presence_penalty", None),
    (CHAT, {**GOOD, "stream_options": {"include_usage": True}}, API_KEY, 400,
     "stream_options", None),
    (CHAT, {**GOOD, "max_token": 5}, API_KEY, 400, "max_token", None),  # a field misspelt
    (COMPLETIONS, {"model": "m", "prompt": "hello", "messages": []}, API_KEY, 400, "messages",
     None),  # chat's field
    (CHAT, {**GOOD, "reasoning_effort": "high"}, API_KEY, 400, "reasoning_effort", None),
    (CHAT, {**GOOD, "tools": [{"name": "f"}]}, API_KEY, 400, "tools", None),
    (CHAT, {**GOOD, "tools": TOOLS, "tool_choice": "required"}, API_KEY, 400, "tool_choice",
     None),  # a forced call needs constrained decoding
    (CHAT, {**GOOD, "tools": TOOLS, "stream": True}, API_KEY, 400, "stream", None),
    (CHAT, {**GOOD, "tools": [{"type": "function", "function": {**TOOLS[0]["function"],
                                                                "strict": True}}]},
     API_KEY, 400, "tools", None),  # a strict schema needs constrained decoding
    (CHAT, {**GOOD, "messages": [{"role": "user", "content": "the answer"},
                                 {"role": "assistant", "content": None,
                                  "tool_calls": [{"function": {"name": "f"}}]}]},
     API_KEY, 400, "messages[1].tool_calls", None),
    (CHAT, GOOD, "sk-wrong", 401, None, "invalid_api_key"),
    (CHAT, GOOD, None, 401, None, "invalid_api_key"),
    ("/v1/embeddings", GOOD, API_KEY, 404, None, None),
])
def test_bad_requests_get_openais_error_and_the_server_keeps_serving(
        server, path, body, key, status, param, code):
    got, error = request(server, path, body, key)
    assert got == status, error
    assert set(error) == {"error"} and set(error["error"]) == {"message", "type", "param",
                                                                "code"}
    assert error["error"]["param"] == param and error["error"]["code"] == code
    assert error["error"]["message"]
    assert error["error"]["type"] == "invalid_request_error"
    ok, body = request(server, CHAT, GOOD)
    assert ok == 200 and body["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("body, message", [
    ({**GOOD, "max_token": 5},
     "Unrecognized request argument supplied: max_token (did you mean 'max_tokens'?)"),
    ({**GOOD, "chat_template_kwargs": {"tokenize": True}},
     "'chat_template_kwargs' may not set tokenize"),
])
def test_a_bad_field_or_message_is_named(server, body, message):
    status, error = request(server, CHAT, body)
    assert status == 400 and error["error"]["message"].startswith(message), error


def test_openais_bookkeeping_fields_are_taken_and_ignored(server):
    status, body = request(server, CHAT, {**GOOD, "user": "u1", "metadata": {"k": "v"},
                                          "store": False, "service_tier": "auto",
                                          "tool_choice": "none", "modalities": ["text"]})
    assert status == 200 and body["choices"][0]["message"]["content"] is not None


def test_the_key_may_come_in_azures_api_key_header(server):
    """MemAgent's quickstart sends the key as `Authorization: Bearer` and as `api-key`."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        connection.request("POST", CHAT, json.dumps(GOOD), {"api-key": API_KEY,
                                                           "Content-Type": "application/json"})
        assert connection.getresponse().status == 200
    finally:
        connection.close()


def test_the_openai_client_raises_its_own_error_types(server):
    client = client_of(server)
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(**{**GOOD, "model": "gpt-4"})
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt=[3] * (MAX_LEN + 1))
    assert e.value.code == "context_length_exceeded" and e.value.param == "prompt"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url, api_key="nope", max_retries=0).models.list()


@pytest.fixture
def slow_engine(server, monkeypatch):
    """Each decode step takes at least 10 ms: a 480-token reply takes 5 s."""
    engine = server.worker.engine
    original = engine.generate

    def generate(params, state, length, filled=None):
        time.sleep(0.01)
        return original(params, state, length, filled)

    monkeypatch.setattr(engine, "generate", generate)


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_disconnects_frees_its_slot(server, slow_engine, stream):
    tokens_before = metric(server, "generated_tokens_total")
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.request("POST", CHAT, json.dumps({**GOOD, "max_tokens": 480, "stream": stream,
                                                 "ignore_eos": True}),
                       {"Authorization": f"Bearer {API_KEY}",
                        "Content-Type": "application/json"})
    if stream:
        response = connection.getresponse()
        assert response.status == 200
        while b'"content": "' not in response.fp.readline():
            pass  # the role chunk, then the first token's
        response.close()
    else:
        deadline = time.monotonic() + 10
        while metric(server, "slots_busy") == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # decoding has started
    connection.close()
    left = time.monotonic()
    while metric(server, "requests_in_flight") and time.monotonic() - left < 3:
        time.sleep(0.02)
    assert metric(server, "requests_in_flight") == 0 and metric(server, "slots_busy") == 0
    assert metric(server, "generated_tokens_total") - tokens_before < 480
    ok, body = request(server, CHAT, GOOD)
    assert ok == 200 and body["usage"]["completion_tokens"] <= 3


def test_a_full_queue_answers_429_and_then_serves_again(model_dir, monkeypatch):
    with serving(model_dir, max_requests=2) as server:
        original = server.worker.engine.generate
        monkeypatch.setattr(server.worker.engine, "generate",
                            lambda p, s, n, f=None: (time.sleep(0.01), original(p, s, n, f))[1])
        results = []
        threads = [threading.Thread(target=lambda: results.append(request(
            server, CHAT, {**GOOD, "max_tokens": 60, "ignore_eos": True})))
            for _ in range(2)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10
        while metric(server, "requests_in_flight") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        status, error = request(server, CHAT, GOOD)
        assert status == 429 and error["error"]["code"] == "queue_full"
        for thread in threads:
            thread.join(30)
        assert [status for status, _ in results] == [200, 200]
        assert request(server, CHAT, GOOD)[0] == 200
        # more prompts in one request than ever fit: never 429's "retry later"
        status, error = request(server, COMPLETIONS, {"model": "m", "prompt": ["hello"] * 3,
                                                      "max_tokens": 1})
        assert status == 400 and error["error"]["message"] == (
            "'prompt' is a list of 3 prompts, more than this server takes in flight (2, its "
            "--max-requests): send at most that many a request"), error


def test_a_prompt_longer_than_any_that_fits_is_refused_before_it_is_tokenized(server):
    """(tokenizing 4 MB takes seconds.) The bound: 512 tokens (the test server's max_len) x
    11 characters (the tokenizer's longest word) x 4."""
    began = time.monotonic()
    status, error = request(server, COMPLETIONS, {"model": "m", "prompt": "hello " * 700_000})
    assert time.monotonic() - began < 2
    assert status == 400 and error["error"]["code"] == "context_length_exceeded"
    assert error["error"]["message"].startswith(
        "This model's maximum context length is 512 tokens. However, your prompt has 3500000 "
        "characters besides whitespace, more than 512 tokens hold (at most 22528: 4 x 512 x "
        "11, the tokenizer's longest token)."), error


SMALL_LATENCY_S = 2.0  # a small request's, while a large prompt is tokenized (alone: ~0.05 s)


def test_a_large_prompt_being_tokenized_does_not_hold_up_a_small_one(server, monkeypatch):
    """Prompts are tokenized off the event loop, a large one (4.8 MB: seconds) on a thread of
    its own: small requests sent while it is tokenized are each answered within
    SMALL_LATENCY_S, before it is. (The length bound, which would refuse it at once, is lifted
    here.)"""
    monkeypatch.setattr(server.encoder, "max_chars", 10 ** 9)
    done = {}

    def large():
        status, error = request(server, COMPLETIONS, {"model": "m",
                                                      "prompt": "hello world " * 400_000})
        done["large"] = time.monotonic(), status, error["error"]["code"]

    thread = threading.Thread(target=large)
    thread.start()
    time.sleep(0.3)  # its body read, its tokenizing begun
    latencies = []
    for _ in range(3):
        began = time.monotonic()
        status, _ = request(server, COMPLETIONS, {"model": "m", "prompt": "hello world",
                                                  "max_tokens": 1})
        latencies.append(time.monotonic() - began)
        assert status == 200
    finished = time.monotonic()
    thread.join(60)
    assert max(latencies) < SMALL_LATENCY_S, latencies
    at, status, code = done["large"]
    assert (status, code) == (400, "context_length_exceeded")  # 800,000 tokens
    assert at > finished, "the large prompt was tokenized before the small ones"


def test_a_client_that_hangs_up_mid_body_leaves_no_traceback(server):
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    keep = Keep(logging.WARNING)
    logging.getLogger("uvicorn.error").addHandler(keep)
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as connection:
            connection.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                               f"{API_KEY}\r\nContent-Length: 1000\r\n\r\n{{\"model\""
                               .encode())
            time.sleep(0.3)
        time.sleep(0.5)
    finally:
        logging.getLogger("uvicorn.error").removeHandler(keep)
    assert not records, [r.getMessage() for r in records]
    assert request(server, CHAT, GOOD)[0] == 200


# Requests refused before anything is queued: words the tokenizer has no token for in text
# prompts (it would read them as [UNK], as `generate` refuses them), and ids past the rows.
BAD = ["hello zebra the answer", "the quokka is", ["hello world", "the answer is wombat"],
       [3, 4, 101 + 5]]


def test_64_concurrent_clients_each_get_their_own_answer_among_bad_requests(server, model_dir,
                                                                            tmp_path):
    """Bad requests first (as many as slots and more), then 64 good clients with 32 bad
    ones mixed in, all concurrent: every bad request is a 400 naming its field, and every good
    one (prompts of 2 to 300 tokens, replies of 4 to 16, half streamed) equals `generate`'s
    greedy reply to its own prompt, cut at its max_tokens, while the engine ran more than
    one slot at once."""
    # ids the tokenizer has words for (generate refuses others: they decode to nothing)
    prompts = [[3 + (7 * i + 3 * k) % 61 for k in range(2 + (i * 37) % 299)] for i in range(64)]
    caps = [4 + (i * 5) % 13 for i in range(64)]
    expected = generate(model_dir, tmp_path, [{"prompt_ids": p} for p in prompts], 16,
                        "--temperature", "0")
    server.worker.stats.busy_slots_peak = 0
    client = openai.AsyncOpenAI(base_url=server.url, api_key=API_KEY, max_retries=0,
                                timeout=120)

    async def ask(i):
        kwargs = dict(model="m", prompt=prompts[i], max_tokens=caps[i], temperature=0,
                      logprobs=0, extra_body={"return_tokens_as_token_ids": True})
        if i % 2:
            chunks = [c async for c in await client.completions.create(**kwargs, stream=True)]
            choices = [c.choices[0] for c in chunks if c.choices]
            tokens = [t for c in choices if c.logprobs for t in c.logprobs.tokens]
            return ids_of(tokens), "".join(c.text for c in choices), choices[-1].finish_reason
        (choice,) = (await client.completions.create(**kwargs)).choices
        return ids_of(choice.logprobs.tokens), choice.text, choice.finish_reason

    async def ask_badly(i):
        with pytest.raises(openai.BadRequestError) as e:
            await client.completions.create(model="m", prompt=BAD[i % len(BAD)], max_tokens=8,
                                            temperature=0, stream=bool(i % 3 == 0))
        return e.value.param, e.value.message

    async def everyone():
        refused = await asyncio.gather(*(ask_badly(i) for i in range(2 * SLOTS)))
        mixed = await asyncio.wait_for(asyncio.gather(
            *(ask(i) for i in range(64)), *(ask_badly(i) for i in range(32))), 300)
        return refused + mixed[64:], mixed[:64]

    refused, answers = asyncio.run(everyone())
    for i, (param, message) in enumerate(refused):
        if i % len(BAD) == len(BAD) - 1:
            assert param == "prompt" and "token ids must be integers in [0, 101)" in message
        else:
            words = {0: "'zebra'", 1: "'quokka'", 2: "'wombat'"}[i % len(BAD)]
            assert param == "prompt"
            assert f"the tokenizer has no token for {words}" in message, message
    for i, (tokens, text, finish) in enumerate(answers):
        reference = expected[i]["completion_ids"][:caps[i]]
        assert tokens == reference, f"request {i}"
        assert finish == ("stop" if reference[-1] == 2 else "length")
        assert text.split() == [w for w in expected[i]["text"].split()][:len(text.split())]
    peak = metric(server, "slots_busy_peak")
    assert 1 < peak <= SLOTS
