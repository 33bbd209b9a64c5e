"""serve's incremental detokenization and stop strings (`serve/text.py`) on a byte-level BPE
tokenizer (Qwen's kind), where one character can take several tokens: the streamed text is the
tokenizer's own decode of the whole reply, no delta holds half a character, and stop strings
cut the reply as OpenAI does, across token boundaries."""

import pytest

from memagent_jax.serve.text import TextStream

TEXT = "café 日本語 hello world, the answer is 42 日本"


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["hello world café", "the answer is 42"], vocab_size=300,
                            min_frequency=1, special_tokens=["</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="</s>")


def _stream(tokenizer, ids, stop=()):
    stream, deltas = TextStream(tokenizer, stop), []
    for token in ids:
        deltas.append(stream.add(token))
        if stream.stopped:
            break
    deltas.append(stream.finish())
    return stream, deltas


def test_deltas_add_up_to_the_decoded_reply_and_never_split_a_character(tokenizer):
    ids = tokenizer(TEXT)["input_ids"] + [tokenizer.eos_token_id]
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)  # multi-token characters
    stream, deltas = _stream(tokenizer, ids)
    assert "".join(deltas) == stream.text == tokenizer.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in d for d in deltas)
    assert not stream.stopped


@pytest.mark.parametrize("stop, expected", [
    ("本語", "café 日"),                  # inside a run of multi-byte tokens
    ("world, the", "café 日本語 hello "),  # across several tokens
    ("café", ""),                          # at the very start
    ("42 日本", "café 日本語 hello world, the answer is "),  # ends with the last token
    ("not there", TEXT),
])
def test_stop_strings_end_the_reply_before_their_first_occurrence(tokenizer, stop, expected):
    ids = tokenizer(TEXT)["input_ids"]
    stream, deltas = _stream(tokenizer, ids, (stop, "zzz"))
    assert "".join(deltas) == stream.text == expected
    assert stream.stopped == (stop in TEXT)
    if stream.stopped:  # no token was taken after the one that completed the stop string
        assert stop in tokenizer.decode(stream.ids) and stop not in tokenizer.decode(
            stream.ids[:-1])


def test_text_that_may_start_a_stop_string_is_held_back_until_it_cannot(tokenizer):
    ids = tokenizer("hello world")["input_ids"]
    stream = TextStream(tokenizer, ("world peace",))
    released = "".join(stream.add(t) for t in ids)
    assert "world" not in released  # could still become "world peace"
    assert released + stream.finish() == "hello world"
