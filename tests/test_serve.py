"""`memagent-jax serve` through the official `openai` client, on a tiny random model: greedy
output equals `memagent-jax generate` token for token, log-probs equal transformers' forward,
n=4 prefills once, streaming equals non-streaming, stop strings, and `run --url` against it
equals MemAgent's quickstart loop driven by the `openai` client."""

import json
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest
import torch

from memagent_jax.cli import main
from memagent_jax.rollout.agent import ModelSection, build_engine, load_policy
from memagent_jax.rollout.engine import EngineConfig
from memagent_jax.serve.command import OpenAIServer
from memagent_jax.tokenizer import load_tokenizer
from tests.hf_reference import hf_model, write_hf_model, write_tiny_tokenizer
from tests.original_memory_prompts import TEMPLATE, TEMPLATE_FINAL_BOXED

API_KEY = "sk-test"
SEED = 12  # the model's weights
MAX_LEN, SLOTS = 512, 8
MESSAGES = [{"role": "user", "content": "hello world the answer is"},
            {"role": "assistant", "content": "memory"},
            {"role": "user", "content": "the answer"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = write_hf_model(tmp_path_factory.mktemp("serve") / "m", seed=SEED)
    write_tiny_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def server(model_dir):
    """The server on a free loopback port, in this process (its engine can be inspected)."""
    section = ModelSection(path=model_dir)
    policy = load_policy(section, section.load_tokenizer(required=True))
    engine = build_engine(policy.model, EngineConfig(slots=SLOTS, max_len=MAX_LEN,
                                                     top_logprobs=5), None, MAX_LEN)
    server = OpenAIServer(policy, engine, names=("m",), max_len=MAX_LEN, port=0,
                          api_key=API_KEY, shutdown_timeout=5, log_level="warning")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_healthy(server.url)
    yield server
    server.shutdown()
    thread.join(30)
    assert not thread.is_alive()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=60)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def wait_healthy(url: str, deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            get(url.removesuffix("/v1") + "/health")
            return
        except OSError:  # refused, or 503 while starting
            time.sleep(0.1)
    raise TimeoutError(f"{url} not healthy within {deadline_s} s")


def generate(model_dir, tmp_path, lines, max_new_tokens, *flags) -> list[dict]:
    """`memagent-jax generate` on the same engine shape: its output lines."""
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["generate", "--model", model_dir, "--input", str(src), "--output", str(out),
                 "--max-new-tokens", str(max_new_tokens), "--slots", str(SLOTS),
                 "--max-len", str(MAX_LEN), *flags]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def ids_of(tokens) -> list[int]:
    """Token ids from log-prob entries returned with return_tokens_as_token_ids."""
    return [int(t.removeprefix("token_id:")) for t in tokens]


def chat_prompt(model_dir, messages=MESSAGES) -> list[int]:
    """The chat prompt as transformers' own chat template builds it."""
    ids = load_tokenizer(model_dir).apply_chat_template(messages, add_generation_prompt=True,
                                                        tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def forward_logprobs(prompt, tokens, temperature) -> torch.Tensor:
    """transformers' log_softmax(logits / T) at the positions that predict `tokens`."""
    with torch.no_grad():
        logits = hf_model(seed=SEED)(torch.tensor([list(prompt) + list(tokens)])).logits[0]
    return torch.log_softmax(logits.float() / (temperature or 1.0), -1)[len(prompt) - 1:-1]


def test_greedy_completions_equal_generate(client, model_dir, tmp_path):
    text = "hello world the answer is"
    (expected,) = generate(model_dir, tmp_path, [{"prompt": text}], 12, "--temperature", "0")
    kwargs = dict(model="m", prompt=text, max_tokens=12, temperature=0, logprobs=3,
                  extra_body={"return_tokens_as_token_ids": True})
    response = client.completions.create(**kwargs)
    (choice,) = response.choices
    assert ids_of(choice.logprobs.tokens) == expected["completion_ids"]
    assert np.allclose(choice.logprobs.token_logprobs, expected["logprobs"], atol=1e-5)
    assert choice.text == expected["text"] and choice.finish_reason == expected["finish_reason"]
    prompt_tokens = len(load_tokenizer(model_dir)(text)["input_ids"])
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (
        prompt_tokens, len(expected["completion_ids"]))
    reference = forward_logprobs(load_tokenizer(model_dir)(text)["input_ids"],
                                 expected["completion_ids"], 0)
    for row, top in zip(reference, choice.logprobs.top_logprobs):
        best = torch.topk(row, 3)
        assert ids_of(top) == best.indices.tolist()
        assert np.allclose(list(top.values()), best.values.numpy(), atol=1e-4)

    chunks = list(client.completions.create(**kwargs, stream=True,
                                            stream_options={"include_usage": True}))
    streamed = [c.choices[0] for c in chunks if c.choices]
    assert "".join(c.text for c in streamed) == choice.text
    assert ids_of(t for c in streamed if c.logprobs for t in c.logprobs.tokens) == \
        expected["completion_ids"]
    assert streamed[-1].finish_reason == choice.finish_reason
    assert chunks[-1].usage.completion_tokens == len(expected["completion_ids"])


def test_greedy_chat_equals_generate_on_the_chat_template(client, model_dir, tmp_path):
    prompt = chat_prompt(model_dir)
    (expected,) = generate(model_dir, tmp_path, [{"prompt_ids": prompt}], 10,
                           "--temperature", "0")
    kwargs = dict(model="m", messages=MESSAGES, max_tokens=10, temperature=0, logprobs=True,
                  top_logprobs=2, extra_body={"return_tokens_as_token_ids": True})
    response = client.chat.completions.create(**kwargs)
    (choice,) = response.choices
    content = choice.logprobs.content
    assert ids_of(c.token for c in content) == expected["completion_ids"]
    assert np.allclose([c.logprob for c in content], expected["logprobs"], atol=1e-5)
    assert choice.message.content == expected["text"]
    assert choice.message.role == "assistant"
    assert response.usage.prompt_tokens == len(prompt)
    assert all(c.top_logprobs[0].token == c.token for c in content)  # greedy: the best

    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason


def test_n4_sampled_prefills_once_and_each_sample_is_ours(client, server, model_dir, tmp_path,
                                                           monkeypatch):
    prompt = chat_prompt(model_dir)
    engine = server.worker.engine
    prefilled = []
    original = engine.prefill
    monkeypatch.setattr(engine, "prefill", lambda params, prompts: (
        prefilled.append(len(prompts)), original(params, prompts))[1])
    kwargs = dict(model="m", messages=MESSAGES, n=4, max_tokens=10, temperature=1.0, seed=7,
                  logprobs=True, extra_body={"return_tokens_as_token_ids": True})
    response = client.chat.completions.create(**kwargs)
    assert prefilled == [1]  # one prompt, prefilled once for its 4 samples
    samples = [ids_of(c.token for c in choice.logprobs.content) for choice in response.choices]
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    assert len({tuple(s) for s in samples}) > 1
    # Sample 0 of a request seeded 7 is line 0 of `generate --seed 7`.
    (expected,) = generate(model_dir, tmp_path, [{"prompt_ids": prompt}], 10,
                           "--temperature", "1.0", "--seed", "7")
    assert samples[0] == expected["completion_ids"]
    for choice, tokens in zip(response.choices, samples):
        reference = forward_logprobs(prompt, tokens, 1.0)
        ours = [c.logprob for c in choice.logprobs.content]
        assert np.allclose(ours, [reference[i, t].item() for i, t in enumerate(tokens)],
                           atol=1e-4)
    assert response.usage.completion_tokens == sum(len(s) for s in samples)

    texts = {}
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
    assert [texts[i] for i in range(4)] == [c.message.content for c in response.choices]


def test_stop_strings_end_the_reply_before_them(client, model_dir):
    base = client.completions.create(model="m", prompt="hello world", max_tokens=16,
                                     temperature=0)
    words = base.choices[0].text.split()
    stop = " ".join(words[3:5])  # two words in the middle of the greedy reply
    cut = base.choices[0].text.index(stop)
    for stream in (False, True):
        response = client.completions.create(model="m", prompt="hello world", max_tokens=16,
                                             temperature=0, stop=[stop, "never seen"],
                                             stream=stream)
        choices = [c.choices[0] for c in response] if stream else response.choices
        assert "".join(c.text for c in choices) == base.choices[0].text[:cut]
        assert choices[-1].finish_reason == "stop"


def test_models_health_and_metrics(client, server):
    assert [m.id for m in client.models.list().data] == ["m"]
    root = server.url.removesuffix("/v1")
    assert json.loads(get(root + "/health")) == {"status": "ok"}
    metrics = get(root + "/metrics")
    assert f"memagent_slots_total {SLOTS}" in metrics


def test_run_url_equals_the_original_quickstart_loop(server, client, model_dir, tmp_path,
                                                     capsys, monkeypatch):
    """`run --url` against our server gives what MemAgent's quickstart loop gets from it
    (its prompts, one chat request per chunk through the openai client, greedy)."""
    monkeypatch.setenv("API_KEY", API_KEY)
    words = ["hello", "world", "the", "answer", "is", "memory"]
    document = " ".join(words[i * 7 % 6] for i in range(50))
    (tmp_path / "doc.txt").write_text(document)
    question = "what is the answer"
    assert main(["run", "--url", server.url, "--model", "m", "--tokenizer", model_dir,
                 "--doc", str(tmp_path / "doc.txt"), "--question", question,
                 "--chunk-tokens", "20", "--max-memory-tokens", "16",
                 "--max-final-tokens", "8", "--temperature", "0", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)

    tokenizer = load_tokenizer(model_dir)
    ids = tokenizer.encode(document)
    memory, memories = "No previous memory", []
    for start in range(0, len(ids), 20):
        message = TEMPLATE.format(prompt=question, chunk=tokenizer.decode(ids[start:start + 20]),
                                  memory=memory)
        memory = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": message}], temperature=0,
            top_p=0.95, max_tokens=16).choices[0].message.content
        memories.append(memory)
    final = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": TEMPLATE_FINAL_BOXED.format(
            prompt=question, memory=memory)}], temperature=0, top_p=0.95, max_tokens=8)
    assert record["memories"] == memories and len(memories) == 3
    assert record["final_reply"] == final.choices[0].message.content
    assert record["finish_reason"] == final.choices[0].finish_reason
    assert record["final_tokens"] == final.usage.completion_tokens
