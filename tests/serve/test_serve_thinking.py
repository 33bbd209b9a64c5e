"""`serve` takes vLLM's `chat_template_kwargs` in chat requests, through the official `openai`
client: a tiny random model with the Qwen3-like tokenizer (its template holds an empty think
block when enable_thinking is false) reads the prompt the kwargs render, and a value that is
not an object is OpenAI's 400 naming the field."""

import numpy as np
import openai
import pytest

from memagent_jax.rollout.chat import chat_ids
from memagent_jax.tokenizer import load_tokenizer
from tests.serve_helpers import (
    MESSAGES,
    chat_prompt,
    client_of,
    forward_logprobs,
    ids_of,
    serving,
)


@pytest.fixture(scope="module")
def client(thinking_model_dir):
    with serving(thinking_model_dir) as server:
        yield client_of(server)


def _chat(client, **extra):
    return client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True,
        extra_body={"return_tokens_as_token_ids": True, **extra})


def test_chat_template_kwargs_render_the_prompt(client, thinking_model_dir):
    """enable_thinking false: the prompt is the template's with the empty think block (two
    tokens more), and the reply's log-probs are transformers' forward on that prompt."""
    tokenizer = load_tokenizer(thinking_model_dir)
    plain = chat_prompt(thinking_model_dir)
    off = chat_ids(tokenizer, MESSAGES, enable_thinking=False)
    assert off == plain + tokenizer.encode("<think> </think>", add_special_tokens=False)
    for kwargs, prompt in [({}, plain), ({"enable_thinking": True}, plain),
                           ({"enable_thinking": False}, off)]:
        response = _chat(client, chat_template_kwargs=kwargs)
        assert response.usage.prompt_tokens == len(prompt), kwargs
        content = response.choices[0].logprobs.content
        reference = forward_logprobs(prompt, ids_of(c.token for c in content), 1.0)
        assert np.allclose([c.logprob for c in content],
                           [reference[i, t].item() for i, t in
                            enumerate(ids_of(c.token for c in content))], atol=1e-4), kwargs
    assert _chat(client).usage.prompt_tokens == len(plain)  # no kwargs: as shipped


def test_chat_template_kwargs_must_be_an_object(client):
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, chat_template_kwargs=["enable_thinking"])
    error = e.value.response.json()["error"]
    assert error["param"] == "chat_template_kwargs" and "must be an object" in error["message"]
    assert _chat(client).choices[0].finish_reason in ("stop", "length")  # still serving


@pytest.mark.parametrize("kwargs, named", [
    ({"chat_template": "{{ 'x' }}"}, "chat_template"),
    ({"max_length": 2, "truncation": True}, "max_length, truncation"),
    ({"return_tensors": "np", "enable_thinking": False}, "return_tensors"),
])
def test_chat_template_kwargs_may_not_set_the_renderers_arguments(client, kwargs, named):
    """Only template variables: a key that apply_chat_template itself takes (another template,
    truncation, a return type) would change the prompt behind the request's back."""
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, chat_template_kwargs=kwargs)
    error = e.value.response.json()["error"]
    assert error["param"] == "chat_template_kwargs" and f"may not set {named}" in error["message"]
