"""`memagent-jax run`: local engine, OpenAI-compatible server mode, and bad input."""

import http.server
import json
import os
import threading
import time

import pytest

from memagent_jax.cli import main
from memagent_jax.rollout.templates import final_prompt, update_prompt
from memagent_jax.tokenizer import load_tokenizer
from tests.hf_reference import write_tiny_model

PREFIX = "memagent-jax: error: "
WORDS = ["hello", "world", "the", "answer", "is", "memory"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("run") / "m", seed=14)


@pytest.fixture
def doc(tmp_path):
    path = tmp_path / "doc.txt"
    path.write_text(" ".join(WORDS[i % 6] for i in range(50)))
    return str(path)


class _ChatServer:
    """A stand-in OpenAI-compatible server on 127.0.0.1 that records every request.
    fail_on / slow_on: the 1-based request number answered with HTTP 500 / after a delay.
    think: each reply thinks first (THOUGHT, FINAL_THOUGHT)."""

    def __init__(self, fail_on=None, slow_on=None, think=False):
        self.requests = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "body": body,
                                        "auth": self.headers.get("Authorization")})
                number = len(server.requests)
                if number == fail_on:
                    self.send_error(500, "boom")
                    return
                if number == slow_on:
                    time.sleep(1.5)
                final = body["messages"][0]["content"].startswith(
                    "You are presented with a problem and a previous memory")
                content = "so \\boxed{Paris}" if final else f"memory {number}"
                if think:
                    content = FINAL_THOUGHT if final else THOUGHT.format(number)
                payload = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
                self.send_response(200)
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
    monkeypatch.setenv("API_KEY", "secret")
    server = _ChatServer()
    try:
        assert _run_url(server, model_dir, doc) == 0
    finally:
        server.close()
    tokenizer = load_tokenizer(model_dir)
    ids = tokenizer(open(doc).read(), add_special_tokens=False)["input_ids"]
    chunks = [tokenizer.decode(ids[i:i + 20]) for i in range(0, 50, 20)]
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
    assert capsys.readouterr().out.strip().splitlines()[-1] == "Paris"


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
    tokenizer = load_tokenizer(model_dir)
    ids = tokenizer(open(doc).read(), add_special_tokens=False)["input_ids"]
    chunks = [tokenizer.decode(ids[i:i + 20]) for i in range(0, 50, 20)]
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
    ({"fail_on": 2}, [], "turn 2 (update): server answered HTTP 500"),
    ({"slow_on": 3}, ["--timeout", "0.5"], "turn 3 (update): request failed"),
])
def test_url_mode_server_failure_names_the_turn(model_dir, doc, capsys, fault, extra, message):
    server = _ChatServer(**fault)
    try:
        assert _run_url(server, model_dir, doc, *extra) == 2
    finally:
        server.close()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(PREFIX) and message in err


def test_local_run_prints_the_answer_or_with_json_only_the_record(model_dir, doc, capsys):
    args = ["run", "--model", model_dir, "--doc", doc, "--question", "what is the answer",
            "--chunk-tokens", "20", "--max-memory-tokens", "4", "--max-final-tokens", "4",
            "--temperature", "0"]
    assert main(args + ["--json"]) == 0
    record = json.loads(capsys.readouterr().out)  # stdout is exactly one JSON document
    assert [c["kind"] for c in record["turns"]] == ["update"] * 3 + ["final"]
    assert record["memories"] == [c["reply"] for c in record["turns"][:3]]
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
                          "model would read [UNK] in their place)")),
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
    assert main(["generate", "--model", model, "--input", str(prompts), "--output", str(out),
                 "--max-new-tokens", "3", "--temperature", "0"]) == 0
    assert len(json.loads(out.read_text())["completion_ids"]) == 3


@pytest.mark.parametrize("command, shown", [
    ("run", ["document tokens per turn (default: the model's memagent.json, else 5000)",
             "(default: the model's, else 1024)", "(default: 0.7)", "(default: 0.95)"]),
    ("generate", ["tokens per completion (default: 256)", "1: off (default: 1.0)"]),
    ("random-model", ["tiny, tiny-qwen3, small (default: tiny)"]),
])
def test_help_shows_the_defaults(capsys, command, shown):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(s in text for s in shown), text
