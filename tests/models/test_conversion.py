"""HF -> our checkpoint -> HF: transformers loads the export, tensors survive bit-exactly."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast

import memagent_jax.pretrained
from memagent_jax.cli import main
from memagent_jax.models.loading import load_model, save_hf
from tests.hf_reference import hf_logits, write_hf_model, write_tiny_tokenizer

pytestmark = pytest.mark.slow  # conversions checked in transformers


def _state_dict(path):
    return AutoModelForCausalLM.from_pretrained(path).state_dict()


@pytest.mark.parametrize("dtype,tied,arch", [("bfloat16", False, "qwen2"),
                                             ("bfloat16", True, "qwen2"),
                                             ("float32", False, "qwen2"),
                                             ("bfloat16", True, "qwen3")])
def test_convert_then_export_is_bit_exact(tmp_path, dtype, tied, arch):
    src = write_hf_model(tmp_path / "src", seed=5, dtype=dtype, tie_word_embeddings=tied,
                         arch=arch, max_shard_size="20KB")  # a sharded source with an index
    assert os.path.isfile(os.path.join(src, "model.safetensors.index.json"))
    write_tiny_tokenizer(src)
    assert main(["convert", "--model", src, "--out", str(tmp_path / "ckpt")]) == 0
    out = str(tmp_path / "out")
    assert main(["export", "--model", str(tmp_path / "ckpt"), "--out", out,
                 "--max-shard-size", "15KB"]) == 0

    index = json.loads(open(os.path.join(out, "model.safetensors.index.json")).read())
    assert len(set(index["weight_map"].values())) > 1
    before, after = _state_dict(src), _state_dict(out)
    assert set(before) == set(after)
    for name, tensor in before.items():
        assert after[name].dtype == getattr(torch, dtype)
        assert torch.equal(tensor, after[name]), name
    hf_config = json.loads(open(os.path.join(out, "config.json")).read())
    assert hf_config["torch_dtype"] == dtype and hf_config["tie_word_embeddings"] == tied
    assert hf_config["model_type"] == arch and hf_config["head_dim"] == (16 if arch == "qwen3"
                                                                         else 8)
    assert os.path.isfile(os.path.join(out, "generation_config.json"))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(out)
    assert tokenizer("hello world")["input_ids"] == [3, 4]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert open(os.path.join(out, name), "rb").read() == open(os.path.join(src, name),
                                                                   "rb").read()


def test_export_writes_a_generation_config_where_the_source_has_none(tmp_path):
    """transformers' generate() stops at generation_config.json's eos_token_id: exporting a
    source that has none writes one with config.json's token ids."""
    src = write_hf_model(tmp_path / "src", seed=8, bos_token_id=4, eos_token_id=7)
    os.remove(os.path.join(src, "generation_config.json"))
    assert main(["convert", "--model", src, "--out", str(tmp_path / "ckpt")]) == 0
    out = str(tmp_path / "out")
    assert main(["export", "--model", str(tmp_path / "ckpt"), "--out", out]) == 0
    generation = GenerationConfig.from_pretrained(out)
    assert (generation.bos_token_id, generation.eos_token_id) == (4, 7)
    assert generation.do_sample is False


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_export_loads_in_transformers_with_equal_logits(tmp_path, arch):
    src = write_hf_model(tmp_path / "src", seed=6, arch=arch, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
        "original_max_position_embeddings": 32})
    model, config = load_model(src)
    save_hf(model, config, str(tmp_path / "out"))
    ids = np.random.RandomState(4).randint(0, 101, (2, 48))
    source = AutoModelForCausalLM.from_pretrained(src).eval()
    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    assert exported.config.rope_parameters["rope_type"] == "yarn"
    assert type(exported).__name__ == f"{arch.title()}ForCausalLM"
    assert np.abs(hf_logits(exported, ids) - hf_logits(source, ids)).max() <= 1e-5
    assert np.abs(np.asarray(model(jnp.asarray(ids))) - hf_logits(source, ids)).max() <= 1e-4


def test_load_from_checkpoint_casts_dtype(tmp_path):
    """A bf16 checkpoint loads as float32 (the CPU default) with the same values."""
    src = write_hf_model(tmp_path / "src", seed=7, dtype="bfloat16")
    assert main(["convert", "--model", src, "--out", str(tmp_path / "ckpt")]) == 0
    from_ckpt, config = load_model(str(tmp_path / "ckpt"), dtype="float32")
    from_hf, _ = load_model(src, dtype="float32")
    assert config.dtype == "float32" and from_ckpt.embed[...].dtype == jnp.float32
    ids = jnp.asarray(np.random.RandomState(5).randint(0, 101, (1, 16)))
    np.testing.assert_array_equal(np.asarray(from_ckpt(ids)), np.asarray(from_hf(ids)))


@pytest.mark.parametrize("preset", ["tiny", "tiny-qwen3"])
def test_random_model_command_writes_a_loadable_preset(tmp_path, preset):
    out = str(tmp_path / "tiny")
    assert main(["random-model", "--preset", preset, "--out", out, "--seed", "3"]) == 0
    reference = AutoModelForCausalLM.from_pretrained(out).eval()
    model, _ = load_model(out)
    ids = np.arange(12)[None]
    assert np.abs(np.asarray(model(jnp.asarray(ids))) - hf_logits(reference, ids)).max() <= 1e-4


@pytest.mark.parametrize("source", ["random-model", "memagent-tiny"])
def test_written_models_declare_their_tokenizers_end_of_text(tmp_path, source):
    """A model whose config has no token ids (random-model's small presets; memagent-tiny,
    exported) gets its tokenizer's in config.json and generation_config.json, so transformers'
    generate() stops at the end of text without being told."""
    out = str(tmp_path / "out")
    command = (["random-model", "--preset", "tiny", "--out", out] if source == "random-model"
               else ["export", "--model", "memagent-tiny", "--out", out])
    assert main(command) == 0
    tokenizer = PreTrainedTokenizerFast.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    generation = GenerationConfig.from_pretrained(out)
    expected = (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert None not in expected
    assert (model.config.bos_token_id, model.config.eos_token_id,
            model.config.pad_token_id) == expected
    assert (generation.bos_token_id, generation.eos_token_id,
            generation.pad_token_id) == expected
    # The shipped model as a user downloads it declares the same.
    shipped = GenerationConfig.from_pretrained(
        os.path.join(os.path.dirname(memagent_jax.pretrained.__file__), "memagent-tiny"))
    assert shipped.eos_token_id == tokenizer.eos_token_id
