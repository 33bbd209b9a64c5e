"""MemAgent's two prompts, byte for byte as the original (docs/algorithm.md section 1).

Each is the text of ONE user message, wrapped in the tokenizer's chat template with the
generation prompt (for Qwen2.5 that adds its default system prompt). Note the space after
`<problem>` and the final newline: both are the original's.

Two forms: `update_prompt` / `final_prompt` give the message text (what an OpenAI-compatible
server is sent; `rollout.chat.chat_prompt_ids` tokenizes a whole message), and `TokenPrompts`
builds the same prompts as token ids the way the original's trainer does (`TokenTemplate` in
original:recurrent/utils.py): the chat-wrapped template is tokenized once, piece by piece
between its placeholders, and each turn's question, memory and chunk ids are spliced in as they
are. Nothing is re-tokenized, so a chunk cut inside a word or inside a multi-byte character
reaches the model exactly as it was cut, and a memory is exactly the ids of the reply it was.
"""

from __future__ import annotations

import re

from memagent_jax.rollout.chat import require_chat_template
from memagent_jax.rollout.thinking import template_kwargs

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


# The gates (`memagent.keep_gate`, `memagent.exit_gate`; off by default, and then the prompt is
# the original's): sentences after the update prompt's instructions naming the one-word replies
# that keep the memory as it is, or stop reading and go to the final turn.
GATE_WORDS = ("keep", "exit")
GATE_SENTENCES = {
    "keep": " If the section adds nothing useful, reply with the single word keep: the memory "
            "is then kept unchanged.",
    "exit": " If the memory already answers the problem, reply with the single word exit: "
            "reading then stops and you answer.",
}
_INSTRUCTIONS_END = "useful information."


def update_prompt(problem: str, memory: str, chunk: str, gates: tuple[str, ...] = ()) -> str:
    """The memory-update user message for one chunk of the document; `gates` (of GATE_WORDS)
    adds their sentences to its instructions."""
    template = UPDATE_TEMPLATE.replace(
        _INSTRUCTIONS_END, _INSTRUCTIONS_END + "".join(GATE_SENTENCES[g] for g in gates), 1)
    return template.format(problem=problem, memory=memory, chunk=chunk)


def final_prompt(problem: str, memory: str) -> str:
    """The final user message: answer from the memory alone."""
    return FINAL_TEMPLATE.format(problem=problem, memory=memory)


_PLACEHOLDER = re.compile(r"\{(problem|memory|chunk)\}")


class TokenPrompts:
    """The two prompts as token ids for one tokenizer (module docstring). `update(problem,
    memory, chunk)` and `final(problem, memory)` take token id sequences; `initial_memory` is
    "No previous memory" tokenized; `update_overhead` the update prompt's own tokens (chat
    markup and template text). thinking: the `memagent.thinking` setting (off: the template
    rendered with enable_thinking=False); gates: those the update prompt offers
    (`update_prompt`)."""

    def __init__(self, tokenizer, thinking: str = "keep", gates: tuple[str, ...] = ()):
        require_chat_template(tokenizer)
        wrapper = tokenizer.apply_chat_template([{"role": "user", "content": "{message}"}],
                                                tokenize=False, add_generation_prompt=True,
                                                **template_kwargs(thinking))
        self._encode = lambda text: list(tokenizer.encode(text, add_special_tokens=False))
        self._update = self._pieces(wrapper, update_prompt("{problem}", "{memory}", "{chunk}",
                                                               gates))
        self._final = self._pieces(wrapper, final_prompt("{problem}", "{memory}"))
        self.initial_memory = tuple(self._encode(INITIAL_MEMORY))
        self.update_overhead = sum(len(p) for p in self._update[0])

    def _pieces(self, wrapper: str, message: str) -> tuple[list[list[int]], list[str]]:
        """(token ids of the text between placeholders, the placeholders' names in order)."""
        parts = _PLACEHOLDER.split(wrapper.replace("{message}", message))
        return [self._encode(p) for p in parts[0::2]], parts[1::2]

    @staticmethod
    def _splice(pieces, **values) -> list[int]:
        texts, names = pieces
        ids = list(texts[0])
        for name, text in zip(names, texts[1:]):
            ids += list(values[name]) + text
        return ids

    def update(self, problem, memory, chunk) -> list[int]:
        """The memory-update prompt's ids around the given question, memory and chunk ids."""
        return self._splice(self._update, problem=problem, memory=memory, chunk=chunk)

    def final(self, problem, memory) -> list[int]:
        """The final prompt's ids around the given question and memory ids."""
        return self._splice(self._final, problem=problem, memory=memory)
