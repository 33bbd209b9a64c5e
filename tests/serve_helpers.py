"""Shared by the serve tests: a tiny random model served in this process on a free loopback
port (module-scoped, so each test module starts one), and references to compare it with."""

import contextlib
import json
import threading
import time
import urllib.request

import openai
import torch

from memagent_jax.cli import main
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.factory import build_engine, load_model_section
from memagent_jax.engine.model_section import ModelSection
from memagent_jax.models.sharding import job_mesh
from memagent_jax.serve.command import OpenAIServer, parse_mesh
from memagent_jax.tokenizer import load_tokenizer
from tests.hf_reference import TINY_SEED, hf_model, write_tiny_model

API_KEY = "sk-test"
SEED = TINY_SEED  # the weights of `model_dir` (tests/conftest.py) and of its thinking twin
MAX_LEN, SLOTS = 512, 8
MESSAGES = [{"role": "user", "content": "hello world the answer is"},
            {"role": "assistant", "content": "memory"},
            {"role": "user", "content": "the answer"}]


def tiny_model_dir(tmp_path_factory, thinking: bool = False) -> str:
    """A tiny random Qwen2 (weights seeded SEED) with the word-level tokenizer (thinking: the
    Qwen3-like one, `write_tiny_tokenizer`)."""
    return write_tiny_model(tmp_path_factory.mktemp("serve") / "m", seed=SEED, thinking=thinking)


@contextlib.contextmanager
def serving(model_dir, mesh=None, api_key=API_KEY, **options):
    """The model served on a free loopback port in this process (its engine can be
    inspected), under the name "m" with api_key; stopped, and checked stopped, on exit.
    mesh: a `--mesh` value (as "data=2,fsdp=4") to spread the model over the 8 test devices."""
    section = ModelSection(path=model_dir)
    device_mesh = job_mesh(parse_mesh(mesh), source="--mesh")
    loaded = load_model_section(section, section.load_tokenizer(required=True), device_mesh)
    engine = build_engine(loaded.model, EngineConfig(slots=SLOTS, max_len=MAX_LEN,
                                                     top_logprobs=5), device_mesh, MAX_LEN)
    server = OpenAIServer(loaded, engine, names=("m",), max_len=MAX_LEN, port=0,
                          api_key=api_key, log_level="warning",
                          **{"shutdown_timeout": 5, **options})
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_healthy(server.url)
        yield server
    finally:
        server.shutdown()
        thread.join(30)
        assert not thread.is_alive()


def client_of(server) -> openai.OpenAI:
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
    assert main(["generate", "--model", model_dir, "--input", str(src), "--out", str(out),
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
