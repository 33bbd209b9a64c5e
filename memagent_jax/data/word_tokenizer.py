"""A word-level vocabulary written as the byte-level BPE tokenizer that transformers' Qwen2
class rebuilds, so that `AutoTokenizer.from_pretrained` reads our ids.

transformers 5 loads the tokenizer of every `model_type: qwen2` directory as `Qwen2Tokenizer`,
whatever `tokenizer_class` says: it keeps tokenizer.json's vocabulary, merges, added tokens and
post-processor, and puts Qwen2's own pipeline around them (NFC; Qwen's split regex; byte-level
pieces with `add_prefix_space` from tokenizer_config.json; BPE with no unknown token; byte-level
decoding). A word-level tokenizer in any other form is rebuilt into different ids without an
error. So the tokenizer written here IS that pipeline, and the word-level reading is in its
vocabulary:
- a letters-only word `w` is the BPE token `Ġw` (" w" byte-level), reached by a chain of
  merges from `Ġ`; every piece gets its `Ġ` (`add_prefix_space`), so a word reads the same
  after a space, a newline or a bracket, and decodes with one space before it;
- every other entry (special tokens, punctuation runs, `\\boxed{`) and the chat roles are added
  tokens: matched on the raw text before the BPE, longest first, absorbing the whitespace
  around them, so the line breaks of the chat and prompt templates read as nothing, as a
  word-level tokenizer reads them; they decode as written, with no space;
- whitespace bytes other than the space are not in the vocabulary, so the BPE drops them; every
  other byte is, with the merge steps, at ids from `PIECE_IDS` on, which no model has rows for:
  text outside the vocabulary reads as ids a model refuses, never as nothing or as a known word.
On text of vocabulary words, punctuation and single spaces this reads the ids the word-level
reading `\\boxed\\{|\\w+|[^\\w\\s]+` gives. Whitespace that is not one space and touches no added
token (two spaces, or a line break, between two words) reads as one piece `Ġ`. Punctuation
decodes with no space before it, so two runs that make a third ("}" and "." of "}.") read back
as that one, as they did through the word-level tokenizer's decoding.
"""

from __future__ import annotations

import json
import os
import re

from memagent_jax.tokenizer import PIECE_IDS

_LETTERS = re.compile(r"[A-Za-z]+")


def build(words: list[str], roles: tuple[str, ...], chat_template: str):
    """The tokenizer (`PreTrainedTokenizerFast`) whose ids are `words`' indices: words[0:3] are
    the pad, bos and eos tokens; `roles` (the chat template's role words) are added tokens, so
    the template's whitespace around them reads as nothing."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        normalizers,
        pre_tokenizers,
        processors,
    )
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)
    space = byte_level.pre_tokenize_str(" ")[0][0]
    dropped = {byte_level.pre_tokenize_str(c)[0][0][-1] for c in "\t\n\r\x0b\x0c"}
    bpe_words = {w for w in words if _LETTERS.fullmatch(w) and w not in roles}
    vocab = {space + w if w in bpe_words else w: i for i, w in enumerate(words)}
    pieces = [c for c in sorted(pre_tokenizers.ByteLevel.alphabet())
              if c not in dropped and c not in vocab]
    merges: dict[tuple[str, str], None] = {}  # ordered, once each
    for w in words:
        if w in bpe_words:
            token = space + w
            pieces += [token[:end] for end in range(2, len(token)) if token[:end] not in vocab]
            merges.update(((token[:end - 1], token[end - 1]), None)
                          for end in range(2, len(token) + 1))
    vocab.update((piece, PIECE_IDS + i) for i, piece in enumerate(dict.fromkeys(pieces)))
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=list(merges), dropout=None, unk_token=None,
                              continuing_subword_prefix="", end_of_word_suffix="",
                              fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        byte_level])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    absorbing = {"normalized": False, "lstrip": True, "rstrip": True}
    tokenizer.add_special_tokens([AddedToken(w, special=True, **absorbing) for w in words[:3]])
    tokenizer.add_tokens([AddedToken(w, single_word=w in roles, **absorbing)
                          for w in words[3:] if w not in bpe_words])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=words[0],
                                      bos_token=words[1], eos_token=words[2],
                                      add_prefix_space=True)
    wrapped.chat_template = chat_template
    return wrapped


def save(tokenizer, out_dir: str) -> None:
    """`tokenizer.save_pretrained(out_dir)`, naming `PreTrainedTokenizerFast` as its class:
    transformers 5 writes its own `TokenizersBackend`, which transformers 4 cannot load; both
    load tokenizer.json as written under this name (5 rebuilds a qwen2 model's as above, to
    the same ids)."""
    tokenizer.save_pretrained(out_dir)
    path = os.path.join(out_dir, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(path, "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
