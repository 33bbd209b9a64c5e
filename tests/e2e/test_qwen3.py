"""A Qwen3 model through the commands, against transformers' Qwen3ForCausalLM: `run`'s memory
loop turn by turn, and `serve`'s chat completions through the `openai` client (greedy)."""

import json

import numpy as np
import pytest
import torch

from memagent_jax.agents.memagent.templates import TokenPrompts
from memagent_jax.cli import main
from memagent_jax.tokenizer import load_tokenizer
from tests.hf_reference import hf_model, write_tiny_model
from tests.serve_helpers import MESSAGES, chat_prompt, client_of, ids_of, serving

pytestmark = pytest.mark.slow  # end to end against transformers

SEED, EOS = 21, 2
WORDS = ["hello", "world", "the", "answer", "is", "memory"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("qwen3") / "m", seed=SEED, arch="qwen3")


@pytest.fixture(scope="module")
def reference():
    return hf_model(seed=SEED, arch="qwen3")


def _greedy(reference, prompt: list[int], max_new_tokens: int) -> tuple[list[int], list[float]]:
    """transformers' greedy reply to prompt (up to EOS) and each token's log-prob. The mask is
    explicit: a reply may hold id 0, which generate() would otherwise mask as padding."""
    ids = torch.tensor([prompt])
    out = reference.generate(ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=EOS, pad_token_id=0,
                             output_scores=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt):].tolist()
    return tokens, [torch.log_softmax(s[0], -1)[t].item() for s, t in zip(out.scores, tokens)]


def test_run_reads_a_document_as_transformers_would(model_dir, reference, tmp_path, capsys):
    """`run --temperature 0`: every memory and the final reply are what transformers' greedy
    decoding gives on the same prompts, each memory built from the previous reply's ids
    (the workflow of docs/algorithm.md section 1, written out here)."""
    document, question = " ".join(WORDS[i % 6] for i in range(50)), "what is the answer"
    (tmp_path / "doc.txt").write_text(document)
    assert main(["run", "--model", model_dir, "--doc", str(tmp_path / "doc.txt"),
                 "--question", question, "--chunk-tokens", "20", "--max-memory-tokens", "12",
                 "--max-final-tokens", "12", "--temperature", "0", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)

    tokenizer = load_tokenizer(model_dir)
    prompts = TokenPrompts(tokenizer)
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
    problem, ids = encode(question), encode(document)
    memory, memories = list(prompts.initial_memory), []
    for start in range(0, len(ids), 20):
        reply, _ = _greedy(reference, prompts.update(problem, memory, ids[start:start + 20]), 12)
        memory = [t for t in reply if t != EOS]
        memories.append(tokenizer.decode(memory, skip_special_tokens=True))
    final, _ = _greedy(reference, prompts.final(problem, memory), 12)
    assert len(memories) == 3
    assert record["memories"] == memories
    assert record["final_reply"] == tokenizer.decode(final, skip_special_tokens=True)


def test_serve_chat_is_transformers_greedy_reply(model_dir, reference):
    prompt = chat_prompt(model_dir)
    tokens, logprobs = _greedy(reference, prompt, 10)
    with serving(model_dir) as server:
        response = client_of(server).chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=10, temperature=0, logprobs=True,
            extra_body={"return_tokens_as_token_ids": True})
    content = response.choices[0].logprobs.content
    assert response.usage.prompt_tokens == len(prompt)
    assert ids_of(c.token for c in content) == tokens
    assert np.abs(np.array([c.logprob for c in content]) - logprobs).max() <= 1e-4
