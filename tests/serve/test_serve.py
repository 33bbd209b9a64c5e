"""`memagent-jax serve` through the official `openai` client, on a tiny random model: greedy
output equals `memagent-jax generate` token for token, log-probs equal transformers' forward,
n=4 prefills once, streaming equals non-streaming, stop strings; `run --url` against it equals
MemAgent's quickstart loop driven by the `openai` client, and `eval` with `model.url` equals
`run --url` question by question."""

import json
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from memagent_jax.cli import main
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Scheduler
from memagent_jax.rollout.runner import AgentRunner
from memagent_jax.tokenizer import load_tokenizer, unknown_id
from tests.original_memory_prompts import TEMPLATE, TEMPLATE_FINAL_BOXED
from tests.serve_helpers import (
    API_KEY,
    MESSAGES,
    SLOTS,
    chat_prompt,
    client_of,
    forward_logprobs,
    generate,
    get,
    ids_of,
    serving,
)

pytestmark = pytest.mark.slow  # a server of its own

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "eval" / "tiny_cpu.yaml"


@pytest.fixture(scope="module")
def server(model_dir):
    with serving(model_dir) as server:
        yield server


@pytest.fixture
def client(server):
    return client_of(server)


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
    assert chunks[-1].usage == response.usage  # usage in every response, streams too
    assert all(c.usage is None for c in chunks[:-1])


def test_a_word_read_as_unknown_is_served_as_the_engine_reads_it(client, server, model_dir):
    """One check of chat text on both roads (`conversation.check_readable`): a word the
    word-level tokenizer reads as [UNK], an id the model has, reaches an agent's call on the
    engine as that id, and `serve` takes the same messages (the official client): the same
    prompt, and greedy, the same reply ids."""
    messages = [{"role": "user", "content": "hello zebra the answer is"}]
    response = client.chat.completions.create(
        model="m", messages=messages, max_tokens=6, temperature=0, logprobs=True,
        extra_body={"return_tokens_as_token_ids": True})
    served = ids_of(c.token for c in response.choices[0].logprobs.content)

    async def rollout(row, policy):
        return [messages + [(await policy.chat(messages, max_tokens=6)).message]]

    tokenizer, worker = load_tokenizer(model_dir), server.worker
    runner = AgentRunner(Scheduler(worker.engine), tokenizer, server._served.stop_ids)
    agent = types.SimpleNamespace(name="one call", rollout=rollout)
    ((trajectory,),) = runner.with_params(worker.params).run(agent, [None], SamplingParams(0.0))
    (turn,) = trajectory.turns
    assert unknown_id(tokenizer) in turn.prompt_ids
    assert response.usage.prompt_tokens == len(turn.prompt_ids)
    assert served == turn.response_ids


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
    (its prompts, one chat request per chunk through the openai client, greedy). Its key is
    in MEMAGENT_API_KEY, the variable `serve` reads its own from."""
    monkeypatch.delenv("API_KEY", raising=False)
    monkeypatch.setenv("MEMAGENT_API_KEY", API_KEY)
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


def test_serve_reads_its_key_from_memagent_api_key(model_dir, monkeypatch, capsys):
    """Without --api-key, `serve`'s key is MEMAGENT_API_KEY's (what `run --url` sends); set but
    empty, no key (a key of "" would refuse every client that sends one)."""
    from memagent_jax.serve import command

    keys = []

    class Recorded:  # the server's arguments, and nothing served
        url = "http://127.0.0.1:0/v1"

        def __init__(self, *args, api_key, **kwargs):
            keys.append(api_key)

        def run(self):
            pass

    monkeypatch.setattr(command, "OpenAIServer", Recorded)
    for value in ("sk-env", ""):
        monkeypatch.setenv("MEMAGENT_API_KEY", value)
        assert main(["serve", "--model", model_dir, "--port", "0"]) == 0
    assert keys == ["sk-env", None]
    capsys.readouterr()


def test_eval_with_a_url_backend_equals_run_url(server, model_dir, tmp_path, capsys,
                                                monkeypatch):
    """`eval` with model.url runs each question's memory loop on the server: its replies are
    `run --url`'s on the same question and context, one request per turn, scored by the
    runner."""
    from memagent_jax.data.io import write_set

    monkeypatch.setenv("API_KEY", API_KEY)
    # QA records in the tokenizer's words: `run` refuses words it cannot represent
    words = ["hello", "world", "the", "answer", "is", "memory"]
    sets = [str(tmp_path / "eval_12.json")]
    write_set(sets[0], [{"context": " ".join(words[(i * k) % 6] for i in range(150)),
                         "input": "what is the answer", "answers": ["hello"]}
                        for k in (5, 7)])
    root = server.url.removesuffix("/v1")
    before = _metric(get(root + "/metrics"), "requests_total")
    out = tmp_path / "out"
    assert main(["eval", "--config", str(CONFIG), f"model.path={model_dir}",
                 f"model.url={server.url}", "model.served_name=m", "sampling.temperature=0",
                 "sampling.n=2", f"data.sets={json.dumps(sets)}", f"output_dir={out}"]) == 0
    lines = [json.loads(x) for x in (out / "samples" / "eval_12.jsonl").read_text().splitlines()]
    assert sorted(line["row"] for line in lines) == [0, 1]
    requests = _metric(get(root + "/metrics"), "requests_total") - before
    assert requests == sum(2 * line["turns"] for line in lines)
    capsys.readouterr()
    records = json.loads(open(sets[0]).read())
    for line in lines:
        record = records[line["row"]]
        (tmp_path / "doc.txt").write_text(record["context"])
        assert main(["run", "--url", server.url, "--model", "m", "--tokenizer", model_dir,
                     "--doc", str(tmp_path / "doc.txt"), "--question", record["input"],
                     "--chunk-tokens", "64", "--max-memory-tokens", "8",
                     "--max-final-tokens", "8", "--temperature", "0", "--json"]) == 0
        reply = json.loads(capsys.readouterr().out)
        assert [run["reply"] for run in line["runs"]] == [reply["final_reply"]] * 2
        assert line["runs"][0]["response_tokens"] == reply["final_tokens"]
        assert line["runs"][0]["finish_reason"] == reply["finish_reason"]


def _metric(text: str, name: str) -> int:
    return int(next(line.split()[1] for line in text.splitlines()
                    if line.startswith(f"memagent_{name} ")))


def test_a_list_of_prompts_is_seeded_as_generate_seeds_its_lines(client, model_dir, tmp_path):
    """Prompt i of a completions list is sampled with seed + i, as line i of `generate
    --seed`; its n choices are indexed i * n + j."""
    texts = ["hello world", "the answer is memory"]
    expected = generate(model_dir, tmp_path, [{"prompt": t} for t in texts], 8,
                        "--temperature", "1.0", "--seed", "5")
    response = client.completions.create(
        model="m", prompt=texts, n=2, max_tokens=8, temperature=1.0, seed=5, logprobs=0,
        extra_body={"return_tokens_as_token_ids": True})
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    samples = [ids_of(c.logprobs.tokens) for c in response.choices]
    assert samples[0] == expected[0]["completion_ids"]
    assert samples[2] == expected[1]["completion_ids"]
    prompt_tokens = sum(len(load_tokenizer(model_dir)(t)["input_ids"]) for t in texts)
    assert response.usage.prompt_tokens == prompt_tokens


def test_a_model_spread_over_a_mesh_serves_the_same_tokens(client, model_dir):
    """--mesh data=2,fsdp=2,tensor=2 over the 8 test devices (slots split over data, weights
    over fsdp and tensor): greedy replies and log-probs as on one device."""
    kwargs = dict(model="m", prompt=["hello world the answer is", "memory"], max_tokens=8,
                  temperature=0, logprobs=2, extra_body={"return_tokens_as_token_ids": True})
    one_device = client.completions.create(**kwargs)
    with serving(model_dir, mesh="data=2,fsdp=2,tensor=2") as sharded:
        assert sharded.worker.engine.mesh.devices.size == 8
        spread = client_of(sharded).completions.create(**kwargs)
    for a, b in zip(one_device.choices, spread.choices, strict=True):
        assert a.logprobs.tokens == b.logprobs.tokens and a.text == b.text
        assert np.allclose(a.logprobs.token_logprobs, b.logprobs.token_logprobs, atol=1e-5)
