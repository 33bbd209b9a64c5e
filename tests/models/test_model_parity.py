"""Our Qwen against transformers' Qwen2ForCausalLM and Qwen3ForCausalLM: same random weights,
same logits (f32)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memagent_jax.engine.engine import Engine
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Request, complete
from memagent_jax.models.loading import load_model
from memagent_jax.models.qwen import KVCache, split_params
from tests.hf_reference import hf_logits, hf_model, write_hf_model

pytestmark = pytest.mark.slow  # models against transformers

TOL = 1e-4
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 64}

CASES = {
    "untied_gqa2": {},
    "tied": {"tie_word_embeddings": True},
    "mha_ratio1": {"num_key_value_heads": 4},
    "gqa_ratio7": {"hidden_size": 56, "num_attention_heads": 7, "num_key_value_heads": 1},
    "yarn": {"rope_parameters": YARN},
    # Qwen2.5's long-context setting: YaRN over theta 1e6 (positions 64-79 past its original
    # window, where the scaling acts).
    "yarn_theta_1e6": {"rope_parameters": {**YARN, "rope_theta": 1e6}},
    "theta_1e6": {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
    # Qwen3: head norms, no q/k/v biases, head_dim 16 where hidden / heads is 8 (TINY_QWEN3).
    "qwen3_untied_gqa2": {"arch": "qwen3"},
    "qwen3_tied": {"arch": "qwen3", "tie_word_embeddings": True},
    "qwen3_gqa_ratio7": {"arch": "qwen3", "hidden_size": 56, "num_attention_heads": 7,
                         "num_key_value_heads": 1},
    "qwen3_yarn_theta_1e6": {"arch": "qwen3", "rope_parameters": {**YARN, "rope_theta": 1e6}},
    # An epsilon far from the 1e-6 of the cases above, which every RMSNorm (the q/k head
    # norms too) must take from the config.
    "qwen3_rms_norm_eps_0.1": {"arch": "qwen3", "rms_norm_eps": 0.1},
    # The unmasked forward on jax.nn.dot_product_attention (cuDNN's kernel on a GPU).
    "qwen3_dot_product": {"arch": "qwen3", "attention": "dot_product"},
}


def _compare_unpadded(tmp_path, seq_len=80, attention="xla", **overrides):
    path = write_hf_model(tmp_path / "hf", seed=1, **overrides)
    model, _ = load_model(path, attention=attention)
    ids = np.random.RandomState(0).randint(0, 101, (2, seq_len))
    ours = np.asarray(model(jnp.asarray(ids)))
    ref = hf_logits(hf_model(seed=1, **overrides), ids)
    return np.abs(ours - ref).max()


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(tmp_path, case):
    assert _compare_unpadded(tmp_path, **CASES[case]) <= TOL


@pytest.mark.parametrize("case", ["yarn_theta_1e6", "qwen3_yarn_theta_1e6"])
def test_yarn_theta_1e6_greedy_decoding_matches_transformers(tmp_path, case):
    """Qwen2.5's and Qwen3's long-context rope (YaRN over theta 1e6) on the decoding path: a
    56-token prompt prefilled, then 16 greedy tokens decoded, predicted at positions 55-70 (the
    last 7 past the original 64-position window): transformers' greedy generate's tokens, each
    log-prob within TOL."""
    import torch

    overrides = CASES[case]
    model, _ = load_model(write_hf_model(tmp_path / "hf", seed=5, **overrides))
    prompt = [int(t) for t in np.random.RandomState(4).randint(3, 101, 56)]
    greedy = SamplingParams(temperature=0.0, seed=0)
    (completion,), = complete(Engine(model, EngineConfig(slots=1, max_len=80)),
                              split_params(model)[1], [Request(prompt, 16, greedy, stop_ids=(2,))])
    reference = hf_model(seed=5, **overrides).generate(
        torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=2,
        pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    tokens = reference.sequences[0, len(prompt):].tolist()
    logprobs = [torch.log_softmax(s[0], -1)[t].item() for s, t in zip(reference.scores, tokens)]
    assert len(tokens) == 16  # no early stop before the window's end
    assert completion.token_ids == tokens
    assert np.abs(np.array(completion.logprobs) - np.array(logprobs)).max() <= TOL


def test_long_sequence_matches_transformers(tmp_path):
    """300 tokens: the blocked causal attention runs 2 query blocks of 256, the last padded."""
    assert _compare_unpadded(tmp_path, seq_len=300, num_key_value_heads=1) <= TOL


def test_configured_attention_serves_the_unmasked_forward_and_its_gradient(tmp_path):
    """attention="dot_product" (jax.nn.dot_product_attention: XLA's kernel on a CPU, which
    builds the [T, T] scores the blocked kernel never does; cuDNN's on a GPU) runs the unmasked
    forward that training differentiates: logits as transformers', gradient as the blocked
    kernel's."""
    path = write_hf_model(tmp_path / "hf", seed=1)
    ids = jnp.asarray(np.random.RandomState(0).randint(0, 101, (2, 300)))
    assert np.abs(np.asarray(load_model(path, attention="dot_product")[0](ids))
                  - hf_logits(hf_model(seed=1), np.array(ids))).max() <= TOL

    def gradient(attention):
        graphdef, state = nnx.split(load_model(path, attention=attention)[0])
        loss = lambda state: jnp.mean(nnx.merge(graphdef, state)(ids)[:, :, 7] ** 2)
        grad = jax.jit(jax.grad(loss))
        square = "300,300]" in grad.lower(state).compile().as_text()
        return jax.tree.leaves(grad(state)), square

    (fused, fused_square), (blocked, blocked_square) = gradient("dot_product"), gradient("xla")
    assert fused_square and not blocked_square
    for a, b in zip(fused, blocked, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4 * np.abs(b).max())


def test_old_rope_config_form_matches(tmp_path):
    """config.json with top-level rope_theta + rope_scaling (pre-transformers-5 form)."""
    from transformers import AutoModelForCausalLM

    path = write_hf_model(tmp_path / "hf", seed=2, rope_parameters=YARN)
    config_file = tmp_path / "hf" / "config.json"
    config = json.loads(config_file.read_text())
    del config["rope_parameters"]
    config["rope_theta"] = 10000.0
    config["rope_scaling"] = {"type": "yarn", "factor": 4.0,
                              "original_max_position_embeddings": 64}
    config_file.write_text(json.dumps(config))

    model, ours_config = load_model(path)
    assert ours_config.rope_scaling["factor"] == 4.0 and ours_config.rope_theta == 10000.0
    ids = np.random.RandomState(1).randint(0, 101, (1, 100))
    reference = AutoModelForCausalLM.from_pretrained(path).eval()
    assert np.abs(np.asarray(model(jnp.asarray(ids))) - hf_logits(reference, ids)).max() <= TOL
    # And the yarn rope really differs from the unscaled one at these lengths.
    plain = hf_logits(hf_model(seed=2), ids)
    assert np.abs(np.asarray(model(jnp.asarray(ids))) - plain).max() > 1e-3


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_matches_each_sequence_alone(tmp_path, side, arch):
    path = write_hf_model(tmp_path / "hf", seed=3, arch=arch)
    model, _ = load_model(path)
    reference = hf_model(seed=3, arch=arch)
    rng = np.random.RandomState(2)
    lengths, width = [5, 17, 12], 17
    ids = np.zeros((3, width), np.int32)
    mask = np.zeros((3, width), np.int32)
    for row, n in enumerate(lengths):
        cols = slice(width - n, width) if side == "left" else slice(0, n)
        ids[row, cols] = rng.randint(3, 101, n)
        mask[row, cols] = 1
    logits = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
    for row, n in enumerate(lengths):
        cols = slice(width - n, width) if side == "left" else slice(0, n)
        expected = hf_logits(reference, ids[row:row + 1, cols])[0]
        assert np.abs(logits[row, cols] - expected).max() <= TOL


@pytest.mark.parametrize("tied,arch", [(False, "qwen2"), (True, "qwen2"), (False, "qwen3")])
def test_kv_cache_prefill_then_decode_matches_full_forward(tmp_path, tied, arch):
    """Two prompts of different lengths prefilled (right-padded to a bucket), their keys and
    values copied into a longer per-layer cache, then N decode steps; the prefill's last-token
    logits and every step's logits equal the full forward's at that position (the tied head
    is computed vocabulary-major on these paths)."""
    path = write_hf_model(tmp_path / "hf", seed=4, arch=arch, tie_word_embeddings=tied)
    model, config = load_model(path)
    rng = np.random.RandomState(3)
    full = rng.randint(3, 101, (2, 20))
    prompt_lengths, bucket, steps = np.array([6, 11]), 16, 8
    reference = [hf_logits(hf_model(seed=4, arch=arch, tie_word_embeddings=tied),
                           full[i:i + 1, :prompt_lengths[i] + steps])[0]
                 for i in range(2)]

    prompt = np.where(np.arange(bucket)[None] < prompt_lengths[:, None], full[:, :bucket], 0)
    logits, keys, values = model.prefill(jnp.asarray(prompt), jnp.asarray(prompt_lengths - 1))
    assert [k.shape for k in keys] == [(2, bucket, config.num_kv_heads, config.head_dim)] * 2
    for i in range(2):
        n = prompt_lengths[i]
        assert np.abs(np.asarray(logits[i]) - reference[i][n - 1]).max() <= TOL

    cache = KVCache.zeros(config, batch=2, length=32).write_prefix(keys, values, 0)
    for step in range(steps):
        pos = prompt_lengths + step  # each row continues at its own position
        token = full[np.arange(2), pos]
        logits, cache = model.decode_step(jnp.asarray(token), jnp.asarray(pos), cache)
        for i in range(2):
            assert np.abs(np.asarray(logits[i]) - reference[i][pos[i]]).max() <= TOL
