"""Builds tiny random `transformers` Qwen2 / Qwen3 models: the reference our model is tested
against."""

from __future__ import annotations

import numpy as np

TINY = dict(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


# TINY's Qwen3 counterpart: head_dim 16, not hidden / heads = 8 (Qwen3 sets it apart).
TINY_QWEN3 = dict(TINY, head_dim=16)


# The weights' seed of the tiny model the engine, rollout and serve tests run (`model_dir`).
TINY_SEED = 12


def hf_model(seed: int = 0, dtype: str = "float32", arch: str = "qwen2", **overrides):
    """A transformers Qwen2ForCausalLM (arch "qwen2", TINY) or Qwen3ForCausalLM ("qwen3",
    TINY_QWEN3) with every weight (norms and biases too) drawn at random, so no parameter can
    be mis-mapped unnoticed. The scale makes attention sharp and logits O(1): with near-uniform
    attention a wrong rotary angle would hide under the tolerance. overrides are config keys."""
    import torch
    import transformers

    prefix, base = {"qwen2": ("Qwen2", TINY), "qwen3": ("Qwen3", TINY_QWEN3)}[arch]
    torch.manual_seed(seed)
    config = getattr(transformers, f"{prefix}Config")(**{**base, **overrides})
    model = getattr(transformers, f"{prefix}ForCausalLM")(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0.0, 0.25)
    return model.to(getattr(torch, dtype))


def write_hf_model(path, seed: int = 0, dtype: str = "float32", max_shard_size=None,
                   arch: str = "qwen2", **overrides) -> str:
    """Saves hf_model(...) with save_pretrained (safetensors); returns the directory."""
    model = hf_model(seed, dtype, arch, **overrides)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(path), **kwargs)
    return str(path)


def write_tiny_model(path, seed: int, arch: str = "qwen2", thinking: bool = False) -> str:
    """`write_hf_model(path, seed, arch=arch)` with `write_tiny_tokenizer` beside it: a model
    every command takes text prompts for; returns the directory. thinking: the Qwen3-like
    tokenizer."""
    write_tiny_tokenizer(write_hf_model(path, seed=seed, arch=arch), thinking=thinking)
    return str(path)


def hf_logits(model, input_ids: np.ndarray) -> np.ndarray:
    """transformers' logits [B, T, V] float32 for unpadded input_ids [B, T]."""
    import torch
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(input_ids))).logits.float().numpy()


def assert_trained_export_matches_transformers(path: str) -> None:
    """A trained model's Hugging Face directory: our logits against transformers' on 2 x 96
    random tokens, within f32 rounding, and the same greedy tokens."""
    import jax.numpy as jnp
    from transformers import AutoModelForCausalLM

    from memagent_jax.models.loading import load_model

    model, config = load_model(path)
    ids = np.random.RandomState(0).randint(0, config.vocab_size, (2, 96))
    ours = np.asarray(model(jnp.asarray(ids)))
    reference = hf_logits(AutoModelForCausalLM.from_pretrained(path, dtype="float32"), ids)
    # f32 rounding grows with the activations: a trained model's logits reach ~18 (a tiny
    # random model's ~1, where the project's bound is 1e-4), and the two frameworks differ by
    # up to 1.6e-4 on memagent-tiny. The bound scales with the largest logit.
    assert np.abs(ours - reference).max() <= 2e-5 * max(1.0, np.abs(reference).max())
    assert (ours.argmax(-1) == reference.argmax(-1)).all()


# Qwen3's thinking switch in the tiny template: with enable_thinking false the generation prompt
# holds an empty think block (Qwen3's `<|im_start|>assistant\n<think>\n\n</think>\n\n`).
THINKING_TEMPLATE = ("{% for m in messages %}<s> {{ m['content'] }} </s> {% endfor %}"
                     "{% if add_generation_prompt %}<s> "
                     "{% if enable_thinking is defined and enable_thinking is false %}"
                     "<think> </think> {% endif %}{% endif %}")


def write_tiny_tokenizer(path, thinking: bool = False) -> list[str]:
    """Saves a real (word-level) fast tokenizer standing in for Qwen's, with a chat template;
    returns its words, whose ids are their list indices (all below TINY's vocab_size). The
    MemAgent templates' words are in the vocabulary, so prompts decode back to readable text.
    thinking: a Qwen3-like tokenizer instead: `<think>`, `</think>` and `\\boxed` one token each
    (added tokens, after every other word, so the other words keep their ids; `\\boxed x`
    decodes to an answer) and THINKING_TEMPLATE."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from memagent_jax.agents.memagent.templates import (
        FINAL_TEMPLATE,
        INITIAL_MEMORY,
        UPDATE_TEMPLATE,
    )

    words = ["<pad>", "<s>", "</s>", "hello", "world", "[UNK]", "the", "answer", "is", "memory"]
    split = pre_tokenizers.Whitespace().pre_tokenize_str
    # last, "what" and "?": the tests' questions (a question with an unknown word is refused)
    templates = (UPDATE_TEMPLATE + FINAL_TEMPLATE).replace("{{", "{").replace("}}", "}")
    for word, _ in split(templates + INITIAL_MEMORY + " what ?"):
        if word not in words:
            words.append(word)
    think = ["<think>", "</think>", "\\boxed"] if thinking else []
    words += think
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_tokens(think)  # matched whole, before the pre-tokenizer splits them
    assert len(words) <= TINY["vocab_size"]
    # Padding and bos are special, as a real tokenizer's: they decode to no text in a reply,
    # so the server reads back every reply a random model writes (`run --url` sends them).
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="</s>",
                                      pad_token="<pad>", bos_token="<s>")
    wrapped.chat_template = (
        THINKING_TEMPLATE if thinking else
        "{% for m in messages %}<s> {{ m['content'] }} </s> {% endfor %}"
        "{% if add_generation_prompt %}<s> {% endif %}")
    wrapped.save_pretrained(str(path))
    return words
