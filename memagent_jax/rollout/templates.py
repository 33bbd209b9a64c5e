"""MemAgent's two prompts, byte for byte as the original (docs/algorithm.md section 1).

Each is the text of ONE user message; `chat_prompt_ids` wraps it in the tokenizer's chat template
with the generation prompt (for Qwen2.5 that adds its default system prompt), as the original
sends it to vLLM. Note the space after `<problem>` and the final newline: both are the original's.
"""

from __future__ import annotations

from memagent_jax.errors import UserError

INITIAL_MEMORY = "No previous memory"

UPDATE_TEMPLATE = """You are presented with a problem, a section of an article that may contain the answer to the problem, and a previous memory. Please read the provided section carefully and update the memory with the new information that helps to answer the problem. Be sure to retain all relevant details from the previous memory while adding any new, useful information.

<problem> 
{problem}
</problem>

<memory>
{memory}
</memory>

<section>
{chunk}
</section>

Updated memory:
"""

FINAL_TEMPLATE = """You are presented with a problem and a previous memory. Please answer the problem based on the previous memory and put the answer in \\boxed{{}}.

<problem> 
{problem}
</problem>

<memory>
{memory}
</memory>

Your answer:
"""


def update_prompt(problem: str, memory: str, chunk: str) -> str:
    """The memory-update user message for one chunk of the document."""
    return UPDATE_TEMPLATE.format(problem=problem, memory=memory, chunk=chunk)


def final_prompt(problem: str, memory: str) -> str:
    """The final user message: answer from the memory alone."""
    return FINAL_TEMPLATE.format(problem=problem, memory=memory)


def chat_prompt_ids(tokenizer, user_message: str) -> list[int]:
    """The message as one user turn of the tokenizer's chat template, ready for generation."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("the tokenizer has no chat template (tokenizer_config.json "
                        "'chat_template' or chat_template.jinja)")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": user_message}],
                                        tokenize=True, add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 may return an encoding
        ids = ids["input_ids"]
    return list(ids)
