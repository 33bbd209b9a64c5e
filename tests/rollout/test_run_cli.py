"""`memagent-jax run`: local engine, OpenAI-compatible server mode, and bad input."""

import http.server
import json
import os
import signal
import threading
import time

import pytest

from memagent_jax.agents.memagent.templates import final_prompt, update_prompt
from memagent_jax.cli import main
from memagent_jax.errors import UserError
from memagent_jax.rollout.runner import call_seed
from tests.hf_reference import write_tiny_model

pytestmark = pytest.mark.slow  # `run` end to end on models it writes

PREFIX = "memagent-jax: error: "
WORDS = ["hello", "world", "the", "answer", "is", "memory"]
# MemAgent's `run --json` record and turns, key for key in order (as before agents' notes
# became `info`: its memories are the only ones).
RECORD_KEYS = ["problem", "answer", "memories", "final_reply", "finish_reason", "final_tokens",
               "turns"]
TURN_KEYS = ["kind", "reply", "memory", "finish_reason", "response_tokens"]


@pytest.fixture
def doc(tmp_path):
    path = tmp_path / "doc.txt"
    path.write_text(" ".join(WORDS[i % 6] for i in range(50)))
    return str(path)


class _ChatServer:
    """A stand-in OpenAI-compatible server on 127.0.0.1 that records every request.
    fail_on / slow_on: the 1-based request number answered with HTTP 500 / after a delay.
    think: each reply thinks first (THOUGHT, FINAL_THOUGHT). final: the final turn's reply.
    key: the API key it requires, as `serve --api-key` does (401 otherwise); error: (status,
    message) every request is answered with. Errors are OpenAI's JSON, as `serve` and vLLM
    send them."""

    def __init__(self, fail_on=None, slow_on=None, think=False, final="so \\boxed{Paris}",
                 key=None, error=None):
        self.requests = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                auth = self.headers.get("Authorization")
                server.requests.append({"path": self.path, "body": body, "auth": auth})
                number = len(server.requests)
                if number == fail_on:
                    self.send_error(500, "boom")
                    return
                if key is not None and auth != f"Bearer {key}":
                    self._send(401, {"error": {"message": "Incorrect API key provided" if auth
                                               else "You didn't provide an API key"}})
                    return
                if error is not None:
                    self._send(error[0], {"error": {"message": error[1]}})
                    return
                if number == slow_on:
                    time.sleep(1.5)
                is_final = body["messages"][0]["content"].startswith(
                    "You are presented with a problem and a previous memory")
                content = final if is_final else f"memory {number}"
                if think:
                    content = FINAL_THOUGHT if is_final else THOUGHT.format(number)
                self._send(200, {"choices": [{"message": {"content": content}}]})

            def _send(self, status, reply):
                payload = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _run_url(server, model_dir, doc, *extra):
    return main(["run", "--url", server.url, "--model", "served-model", "--tokenizer", model_dir,
                 "--doc", doc, "--question", "what is the answer", "--chunk-tokens", "20",
                 "--max-memory-tokens", "32", "--max-final-tokens", "16", *extra])


def test_url_mode_sends_exactly_the_expected_prompts(model_dir, doc, capsys, monkeypatch):
    monkeypatch.delenv("MEMAGENT_API_KEY", raising=False)
    monkeypatch.setenv("API_KEY", "secret")  # the original quickstart's variable, still read
    server = _ChatServer()
    try:
        assert _run_url(server, model_dir, doc) == 0
    finally:
        server.close()
    # Each chunk as the document's text: its 20 words, the space after them included.
    words = open(doc).read().split(" ")
    chunks = [" ".join(words[i:i + 20]) + (" " if i + 20 < 50 else "") for i in range(0, 50, 20)]
    memory, expected = "No previous memory", []
    for number, chunk in enumerate(chunks, start=1):
        expected.append(update_prompt("what is the answer", memory, chunk))
        memory = f"memory {number}"
    expected.append(final_prompt("what is the answer", memory))
    assert [r["body"]["messages"][0]["content"] for r in server.requests] == expected
    first = server.requests[0]
    assert first["path"] == "/v1/chat/completions" and first["auth"] == "Bearer secret"
    assert first["body"]["model"] == "served-model" and first["body"]["max_tokens"] == 32
    assert (first["body"]["temperature"], first["body"]["top_p"]) == (0.7, 0.95)
    assert server.requests[-1]["body"]["max_tokens"] == 16
    # each call the seed the engine samples it with (--seed 0, row 0, rollout 0, call k)
    assert [r["body"]["seed"] for r in server.requests] == [
        call_seed(0, 0, 0, k)[0] for k in range(len(expected))]
    assert capsys.readouterr().out.strip().splitlines()[-1] == "Paris"


def test_url_mode_seeds_every_call_as_the_engine_does(model_dir, doc):
    server = _ChatServer()
    try:
        assert _run_url(server, model_dir, doc, "--seed", "3") == 0
    finally:
        server.close()
    assert [r["body"].get("seed") for r in server.requests] == [
        call_seed(3, 0, 0, k)[0] for k in range(len(server.requests))]


THOUGHT = "<think>\nmemory {0}? no, </think> not yet</think>\n\nmemory {0}\n"
FINAL_THOUGHT = "<think>\\boxed{Rome}</think>\n\nso \\boxed{Paris}"


@pytest.mark.parametrize("thinking", ["keep", "strip", "off"])
def test_url_mode_thinking(model_dir, doc, capsys, thinking):
    """run --url --thinking: strip carries what follows a reply's last </think> (stripped);
    keep and off the whole reply; off asks the server for enable_thinking false in every
    request (vLLM's chat_template_kwargs). The turns' replies are whole and the answer is the
    final reply's after its last </think> in all three."""
    server = _ChatServer(think=True)
    try:
        assert _run_url(server, model_dir, doc, "--thinking", thinking, "--json") == 0
    finally:
        server.close()
    record = json.loads(capsys.readouterr().out)
    replies = [THOUGHT.format(n) for n in (1, 2, 3)]
    memories = [f"memory {n}" for n in (1, 2, 3)] if thinking == "strip" else replies
    assert record["memories"] == memories
    assert [t["reply"] for t in record["turns"]] == replies + [FINAL_THOUGHT]
    assert record["answer"] == "Paris"
    # Each chunk as the document's text: its 20 words, the space after them included.
    words = open(doc).read().split(" ")
    chunks = [" ".join(words[i:i + 20]) + (" " if i + 20 < 50 else "") for i in range(0, 50, 20)]
    expected = [update_prompt("what is the answer", m, c)
                for m, c in zip(["No previous memory"] + memories, chunks)]
    expected.append(final_prompt("what is the answer", memories[-1]))
    bodies = [r["body"] for r in server.requests]
    assert [b["messages"][0]["content"] for b in bodies] == expected
    kwargs = [{"enable_thinking": False}] * 4 if thinking == "off" else [None] * 4
    assert [b.get("chat_template_kwargs") for b in bodies] == kwargs


def test_local_run_thinking_reaches_the_prompts(tmp_path, doc, capsys):
    """`run --thinking` on the local engine, with the Qwen3-like tokenizer: off renders every
    prompt with the template's empty think block, so the same greedy model says something
    else than under keep; the record's memories are its turns' memories."""
    model = write_tiny_model(tmp_path / "m", seed=14, thinking=True)
    records = {}
    for thinking in ("keep", "off"):
        assert main(["run", "--model", model, "--doc", doc, "--question", "what is the answer",
                     "--chunk-tokens", "20", "--max-memory-tokens", "4",
                     "--max-final-tokens", "4", "--temperature", "0", "--thinking", thinking,
                     "--json"]) == 0
        records[thinking] = json.loads(capsys.readouterr().out)
        assert records[thinking]["memories"] == [t["memory"] for t in
                                                 records[thinking]["turns"][:3]]
    assert records["keep"]["memories"] != records["off"]["memories"]


@pytest.mark.parametrize("fault,extra,message", [
    ({"fail_on": 2}, [], "call 2: server answered HTTP 500"),
    ({"slow_on": 3}, ["--timeout", "0.5"], "call 3: request failed"),
])
def test_url_mode_server_failure_names_the_call(model_dir, doc, capsys, fault, extra, message):
    server = _ChatServer(**fault)
    try:
        assert _run_url(server, model_dir, doc, *extra) == 2
    finally:
        server.close()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(PREFIX) and message in err


def test_url_mode_reads_the_key_serve_reads(model_dir, doc, capsys, monkeypatch):
    """The key is MEMAGENT_API_KEY's (what `serve` reads), else API_KEY's (the original
    MemAgent quickstart's); OPENAI_API_KEY is never sent (a key for api.openai.com would go to
    whatever --url names)."""
    sent = []
    for env in ({"MEMAGENT_API_KEY": "ours"},
                {"MEMAGENT_API_KEY": "ours", "API_KEY": "theirs", "OPENAI_API_KEY": "openai"},
                {"MEMAGENT_API_KEY": "", "API_KEY": "theirs"},
                {"OPENAI_API_KEY": "openai"}):
        for name in ("MEMAGENT_API_KEY", "API_KEY", "OPENAI_API_KEY"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        server = _ChatServer()
        try:
            assert _run_url(server, model_dir, doc) == 0
        finally:
            server.close()
        sent.append({r["auth"] for r in server.requests})
    assert sent == [{"Bearer ours"}, {"Bearer ours"}, {"Bearer theirs"}, {None}]
    capsys.readouterr()


@pytest.mark.parametrize("server_options, env, message", [
    ({"key": "k"}, {}, "call 1: server answered HTTP 401 Unauthorized: You didn't "
                       "provide an API key; set MEMAGENT_API_KEY to the server's key (no key "
                       "was sent)"),
    ({"key": "k"}, {"API_KEY": "old"}, "call 1: server answered HTTP 401 "
                                       "Unauthorized: Incorrect API key provided; set "
                                       "MEMAGENT_API_KEY to the server's key (the key sent was "
                                       "API_KEY's)"),
    ({"error": (404, "The model `served-model` does not exist (served: m)")}, {},
     "call 1: server answered HTTP 404 Not Found: The model `served-model` does not "
     "exist (served: m)"),
])
def test_url_mode_http_errors_say_what_to_do(model_dir, doc, capsys, monkeypatch,
                                             server_options, env, message):
    for name in ("MEMAGENT_API_KEY", "API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    server = _ChatServer(**server_options)
    try:
        assert _run_url(server, model_dir, doc) == 2
    finally:
        server.close()
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar
    assert err == f"{PREFIX}{server.url}: {message}", err


def test_the_answer_prints_stripped(model_dir, doc, capsys):
    """A word-level tokenizer decodes with a space before each word: the answer line is
    stripped."""
    server = _ChatServer(final="so \\boxed{ Paris }")
    try:
        assert _run_url(server, model_dir, doc) == 0
    finally:
        server.close()
    assert capsys.readouterr().out.splitlines()[-1] == "Paris"


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "-1"], "--temperature must be a number >= 0 (0 is greedy), got -1.0"),
    (["--temperature", "inf"], "--temperature must be a number >= 0 (0 is greedy), got inf"),
    (["--top-p", "2"], "--top-p must be in (0, 1] (1: off), got 2.0"),
    (["--top-p", "0"], "--top-p must be in (0, 1] (1: off), got 0.0"),
    (["--url", "http://127.0.0.1:9/v1", "--timeout", "-1"],
     "--timeout must be a positive number of seconds, got -1.0"),
    (["--url", "http://127.0.0.1:9/v1", "--timeout", "0"],
     "--timeout must be a positive number of seconds, got 0.0"),
    # the local engine's flags were ignored under --url
    (["--url", "http://127.0.0.1:9/v1", "--dtype", "bfloat16"],
     "--dtype: the --url server runs the model; the local engine's settings do not apply to it"),
    (["--url", "http://127.0.0.1:9/v1", "--dtype", "float32", "--attention", "xla"],
     "--dtype and --attention: the --url server runs the model; the local engine's settings "
     "do not apply to it"),
])
def test_bad_flags_are_one_line_naming_the_flag(model_dir, doc, capsys, flags, message):
    code = main(["run", "--model", model_dir, "--doc", doc, "--question", "what", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [PREFIX + message], err


def test_ctrl_c_while_a_long_document_is_tokenized_acts_at_once(model_dir, tmp_path, capsys,
                                                                monkeypatch):
    """Tokenizing a document is one call into the tokenizer's Rust library, which holds off
    Python's signal handler on its thread (26 s for 35 MB): Ctrl-C during it ends `run` at once,
    exit 130 with one line, not when the call returns."""
    from memagent_jax import tokenizer as tokenizer_module
    real_check = tokenizer_module.check_representable
    document = " ".join(WORDS[i % 6] for i in range(400_000))  # 2.2 MB: about half a second
    (tmp_path / "long.txt").write_text(document)
    returned = threading.Event()

    def check(tokenizer, text, what):  # Ctrl-C 0.1 s into the document's tokenization
        if text != document:
            return real_check(tokenizer, text, what)
        threading.Timer(0.1, signal.pthread_kill, [main_thread, signal.SIGINT]).start()
        try:
            real_check(tokenizer, text, what)
        finally:
            returned.set()
        raise UserError("not reached on the caller's thread: the test ends its thread here")

    main_thread = threading.get_ident()
    monkeypatch.setattr(tokenizer_module, "check_representable", check)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        code = main(["run", "--model", model_dir, "--doc", str(tmp_path / "long.txt"),
                     "--question", "what is the answer"])
        acted_first = not returned.is_set()
        returned.wait(60)  # the abandoned tokenization ends before the next test
    finally:
        signal.signal(signal.SIGINT, handler)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 130 and err == ["memagent-jax: interrupted (Ctrl-C)"], err
    assert acted_first, "Ctrl-C waited for the tokenizer's call to return"


def test_local_run_prints_the_answer_or_with_json_only_the_record(model_dir, doc, capsys):
    args = ["run", "--model", model_dir, "--doc", doc, "--question", "what is the answer",
            "--chunk-tokens", "20", "--max-memory-tokens", "4", "--max-final-tokens", "4",
            "--temperature", "0"]
    assert main(args + ["--json"]) == 0
    record = json.loads(capsys.readouterr().out)  # stdout is exactly one JSON document
    assert [c["kind"] for c in record["turns"]] == ["update"] * 3 + ["final"]
    assert record["memories"] == [c["reply"] for c in record["turns"][:3]]
    assert list(record) == RECORD_KEYS
    assert [list(c) for c in record["turns"]] == [TURN_KEYS] * 4
    assert record["turns"][-1]["memory"] is None
    assert record["answer"] is None  # random model: no \boxed{}
    assert main(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == [record["final_reply"].strip()]  # no box: the whole reply


@pytest.mark.parametrize("setup,message", [
    ("missing", "doc.txt: not found"),
    ("empty", "the document is empty"),
    ("latin1", "not UTF-8 text (invalid byte at offset 9)"),
    ("long_question", "over the prompt budget of 1024"),
    ("blank_question", "the question is empty"),
    ("unknown_question", ("--question: the tokenizer has no token for 'zaludo', 'qux' (the "
                          "model would read [UNK] in their place")),
    ("unknown_document", "doc.txt: the tokenizer has no token for 'zaludo'"),
])
def test_bad_input_is_one_clear_line(model_dir, tmp_path, capsys, setup, message):
    doc = tmp_path / "doc.txt"
    if setup != "missing":
        doc.write_text("hello world")
    question = "what"
    if setup == "empty":
        doc.write_text("  \n")
    elif setup == "latin1":
        doc.write_bytes("hello caf\u00e9".encode("latin-1"))
    elif setup == "long_question":
        question = " ".join(["hello"] * 1100)
    elif setup == "blank_question":
        question = " \n"
    elif setup == "unknown_question":
        question = "what is zaludo qux zaludo"
    elif setup == "unknown_document":
        doc.write_text("hello zaludo world")
    code = main(["run", "--model", model_dir, "--doc", str(doc), "--question", question])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(PREFIX) and message in err[0], err


def test_the_readme_model_runs_and_generates_text(tmp_path, capsys):
    """`random-model` writes a tokenizer with a chat template, so the quickstart's own model
    answers `run` and text prompts, and exports with it."""
    model = str(tmp_path / "hf")
    assert main(["random-model", "--out", model]) == 0
    assert os.path.isfile(os.path.join(model, "tokenizer.json"))
    doc = tmp_path / "doc.txt"
    doc.write_text("the secret code is apple . " * 30)
    assert main(["run", "--model", model, "--doc", str(doc), "--question", "what is the code ?",
                 "--chunk-tokens", "32", "--max-memory-tokens", "4", "--max-final-tokens", "4",
                 "--temperature", "0"]) == 0
    prompts = tmp_path / "in.jsonl"
    prompts.write_text(json.dumps({"prompt": "the secret code is"}) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["generate", "--model", model, "--input", str(prompts), "--out", str(out),
                 "--max-new-tokens", "3", "--temperature", "0"]) == 0
    assert len(json.loads(out.read_text())["completion_ids"]) == 3


@pytest.mark.parametrize("command, shown", [
    ("run", ["document tokens per turn (default: the model's memagent.json, else 5000)",
             "(default: the model's, else 1024)", "(default: 0.7)", "(default: 0.95)"]),
    ("generate", ["tokens per completion (default: 256)", "1: off (default: 1.0)",
                  "--out OUT.jsonl, --output OUT.jsonl"]),
    ("random-model", ["tiny, tiny-qwen3, small (default: tiny)"]),
])
def test_help_shows_the_defaults(capsys, command, shown):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(s in text for s in shown), text


def test_another_agent_runs_against_a_server_and_locally(model_dir, capsys):
    """`run --agent`: the single-turn agent's one chat request, its settings as a YAML
    mapping, sampled as asked; MemAgent's own flags refused with it."""
    server = _ChatServer(final="no")
    agent = "{module: memagent_jax.agents.single_turn, max_tokens: 7}"
    try:
        assert main(["run", "--url", server.url, "--model", "served-model", "--agent", agent,
                     "--question", "You are presented with a problem and a previous memory",
                     "--temperature", "0.3", "--json"]) == 0
    finally:
        server.close()
    record = json.loads(capsys.readouterr().out)
    (request,) = server.requests
    assert request["body"]["messages"] == [{"role": "user", "content": "You are presented "
                                            "with a problem and a previous memory"}]
    assert (request["body"]["max_tokens"], request["body"]["temperature"],
            request["body"]["seed"]) == (7, 0.3, call_seed(0, 0, 0, 0)[0])
    assert record["final_reply"] == "no" and record["turns"][0]["kind"] == "final"
    assert record["turns"][0]["messages"][-1] == {"role": "assistant", "content": "no"}
    # An agent without a memory has no memory in its record (MemAgent's: RECORD_KEYS).
    assert list(record) == ["problem", "answer", "final_reply", "finish_reason", "final_tokens",
                            "turns"]
    assert list(record["turns"][0]) == ["kind", "reply", "finish_reason", "response_tokens",
                                        "messages"]
    assert main(["run", "--model", model_dir, "--agent", "memagent_jax.agents.single_turn",
                 "--question", "what is the secret code ?", "--temperature", "0"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "--agent single_turn makes conversations of up to 2048 tokens: over the model's "
        "context window of 512 tokens (config.json max_position_embeddings)")
    assert main(["run", "--model", model_dir, "--agent", "memagent_jax.agents.single_turn",
                 "--question", "what is the secret code ?", "--temperature", "0",
                 "--max-len", "64", "--json"]) == 0
    local = json.loads(capsys.readouterr().out)
    assert local["final_reply"] and list(local) == list(record)
    assert list(local["turns"][0]) == list(record["turns"][0])
    assert main(["run", "--model", model_dir, "--agent", "memagent_jax.agents.single_turn",
                 "--question", "q", "--chunk-tokens", "8"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "--chunk-tokens is MemAgent's; --agent takes its settings in its section")


def test_show_tokens_prints_each_conversation_as_trained(model_dir, capsys):
    """`run --show-tokens`: the conversation's text and ids, the generated ones marked (the
    one reply's: every marked id after the prompt), then the answer; refused with --url."""
    assert main(["run", "--model", model_dir, "--agent", "memagent_jax.agents.single_turn",
                 "--question", "what is the secret code ?", "--temperature", "0",
                 "--max-len", "64", "--show-tokens"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("--- conversation 1/1 (final): ")
    ids = out[2].removeprefix("ids: ")
    prompt, marked = ids.split("\u27e6")
    assert marked.endswith("\u27e7") and "\u27e6" not in marked[:-1]
    assert len(marked[:-1].split()) == int(out[0].split(", ")[1].split()[0])  # "N trained"
    assert len(out) == 4  # the answer last
    assert main(["run", "--url", "http://127.0.0.1:1/v1", "--model", "m", "--agent",
                 "memagent_jax.agents.single_turn", "--question", "q", "--show-tokens"]) == 2
    assert "--show-tokens prints the local engine's ids" in capsys.readouterr().err


@pytest.mark.parametrize("make, what", [(os.mkfifo, "a FIFO"), (None, "a device")])
def test_a_doc_that_is_no_regular_file_says_so(model_dir, tmp_path, capsys, make, what):
    """(A FIFO, or /dev/urandom, was "not found"; a read would wait, or never end.)"""
    doc = "/dev/urandom" if make is None else str(tmp_path / "fifo")
    if make is not None:
        make(doc)
    assert main(["run", "--model", model_dir, "--doc", doc, "--question", "what"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"{PREFIX}{doc}: not a regular file (a pipe, a device or a socket), expected a file"]
