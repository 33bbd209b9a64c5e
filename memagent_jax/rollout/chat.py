"""Chat helpers: messages through the tokenizer's chat template, as the ids the model
continues (the runner's prompts, `serve`'s chat completions, eval's baselines)."""

from __future__ import annotations

from memagent_jax.errors import UserError
from memagent_jax.rollout.thinking import template_kwargs
from memagent_jax.rollout.tool_calls import render_input


def chat_prompt_ids(tokenizer, user_message: str, thinking: str = "keep") -> list[int]:
    """The message as one user turn of the tokenizer's chat template, ready for generation
    (`thinking`: the `memagent.thinking` setting; off renders with enable_thinking=False)."""
    return chat_ids(tokenizer, [{"role": "user", "content": user_message}],
                    **template_kwargs(thinking))


def chat_ids(tokenizer, messages: list[dict], **template_vars) -> list[int]:
    """A conversation ({"role", "content"} messages) through the tokenizer's chat template,
    with the generation prompt: the ids the model continues (`serve`'s chat completions).
    template_vars: the template's extra variables (a request's `chat_template_kwargs`, e.g.
    enable_thinking)."""
    require_chat_template(tokenizer)
    messages, template_vars = render_input(tokenizer, messages, template_vars)
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                        **template_vars)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 may return an encoding
        ids = ids["input_ids"]
    return list(ids)


def require_chat_template(tokenizer) -> None:
    """UserError when the tokenizer has no chat template to render messages with."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("the tokenizer has no chat template (tokenizer_config.json "
                        "'chat_template' or chat_template.jinja)")
