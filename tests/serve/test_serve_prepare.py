"""serve's `prepare` on its own (no engine): what a request's prompts are refused for, and
the message naming it, on memagent-tiny's tokenizer (a word vocabulary whose chat template
writes the roles), the lookup task's (whose template collapses whitespace) and on the tests'
word-level one (which reads unknown words as [UNK], as the engine takes them)."""

import asyncio
import types

import pytest

from memagent_jax.lookup import task
from memagent_jax.lookup.tools import TOOL
from memagent_jax.model_dir import resolve
from memagent_jax.rollout.chat import chat_ids
from memagent_jax.rollout.tool_calls import declare_tools
from memagent_jax.serve.encoding import Encoder
from memagent_jax.serve.protocol import APIError, Generation
from memagent_jax.serve.respond import Served, prepare
from memagent_jax.tokenizer import load_tokenizer, unreadable_parts


@pytest.fixture(scope="module")
def tiny():
    return load_tokenizer(resolve("memagent-tiny"))


def _prepare(tokenizer, gen: Generation, vocab_size: int = 4096, max_requests: int = 8):
    """prepare(gen) on a Served with no engine: its token ids, or the APIError's message."""
    encoder = Encoder(tokenizer, 512)
    served = Served(types.SimpleNamespace(max_requests=max_requests), tokenizer, ("m",), 512,
                    (), 0, vocab_size, encoder)
    try:
        return asyncio.run(prepare(served, gen))
    except APIError as e:
        return e.message
    finally:
        encoder.close()


def _chat(*messages) -> Generation:
    return Generation("chat", "m", ([{"role": r, "content": c} for r, c in messages],),
                      max_tokens=4)


@pytest.mark.parametrize("messages, message", [
    ([("system", "the code")],  # the template writes "system", which is no word of the model
     "messages[0].role: the chat template writes the role 'system', which the tokenizer has "
     "no token for (the roles this model reads: user, assistant)"),
    ([("user", "what is the  code")],  # the spaces, not the words around them
     "messages[0].content (user): the tokenizer has no token for '  ' between 'the' and "
     "'code'"),
    ([("user", "the code"), ("assistant", "is"), ("user", "what is the  code")],
     "messages[2].content (user): the tokenizer has no token for '  ' between 'the' and "
     "'code'"),
])
def test_memagent_tiny_refusals_name_the_message_and_what_is_wrong(tiny, messages, message):
    assert _prepare(tiny, _chat(*messages)).startswith(message)
    assert isinstance(_prepare(tiny, _chat(("user", "what is the code"))), list)


def test_what_is_judged_is_the_prompt_the_chat_template_renders(tiny, tmp_path):
    """What the local engine reads is taken: the tool agent's system prompt (line breaks
    between words the lookup tokenizer reads only as one space) through the lookup model's
    template, which collapses whitespace; a space before memagent-tiny's `</s>`, which it
    reads. A word no template removes is still refused, the message holding it named."""
    lookup = load_tokenizer(task.write_tokenizer(str(tmp_path / "lookup")))
    system = declare_tools([TOOL.declaration])
    assert unreadable_parts(lookup, system)  # the raw text alone would be refused
    for tokenizer, messages in [
            (lookup, [("system", system), ("user", "what is the code of nakodo ?")]),
            (tiny, [("user", "what is the code ")])]:
        chat = [{"role": r, "content": c} for r, c in messages]
        assert _prepare(tokenizer, _chat(*messages)) == [chat_ids(tokenizer, chat)]
    refused = _prepare(lookup, _chat(("system", system), ("user", "the code of zebrafoo ?")))
    assert refused.startswith("messages[1].content (user): the tokenizer has no token for "
                              "'zebrafoo'"), refused


def test_every_message_is_read_not_the_last_alone(tiny, word_tokenizer):
    """A word no model has rows for in an earlier message is named; one a word-level tokenizer
    reads as [UNK], an id the model has, is taken, as the engine takes it."""
    refused = _prepare(tiny, _chat(("user", "what is the zebra code"), ("assistant", "is"),
                                   ("user", "what is the code")))
    assert str(refused).startswith("messages[0].content (user): the tokenizer has no token "
                                   "for 'zebra'"), refused
    messages = [("user", "hello zebra"), ("assistant", "memory"), ("user", "the answer")]
    chat = [{"role": r, "content": c} for r, c in messages]
    assert _prepare(word_tokenizer, _chat(*messages)) == [chat_ids(word_tokenizer, chat)]


def test_prepares_own_vocabulary_check_refuses_the_first_id_past_the_rows(word_tokenizer):
    """A tokenizer with more words than the model has rows: a text prompt reading as id
    vocab_size (one past the last row) is refused; one row more, it is read."""
    the, memory = word_tokenizer.convert_tokens_to_ids(["the", "memory"])
    gen = Generation("completion", "m", ("the memory",), max_tokens=4)
    assert _prepare(word_tokenizer, gen, vocab_size=memory) == (
        f"the prompt reads as token id {memory}, outside the model's vocabulary of {memory} "
        "ids")
    assert _prepare(word_tokenizer, gen, vocab_size=memory + 1) == [[the, memory]]


def test_more_prompts_than_the_server_takes_in_flight_can_never_be_taken(word_tokenizer):
    gen = Generation("completion", "m", ("hello",) * 3, max_tokens=1)
    assert "more than this server takes in flight (2, its --max-requests)" in _prepare(
        word_tokenizer, gen, max_requests=2)
    assert len(_prepare(word_tokenizer, gen, max_requests=3)) == 3


def test_without_max_tokens_a_prompt_must_leave_room_for_one_token(word_tokenizer):
    """max_tokens None asks for what the length (512) leaves: a prompt of 512 token ids leaves
    nothing and is refused, OpenAI's words; one of 511 leaves one token."""
    assert _prepare(word_tokenizer, Generation("completion", "m", ([3] * 512,))) == (
        "This model's maximum context length is 512 tokens. However, you requested 512 tokens "
        "in the prompt. Please reduce the length of the prompt or completion.")
    assert _prepare(word_tokenizer, Generation("completion", "m", ([3] * 511,))) == [[3] * 511]
