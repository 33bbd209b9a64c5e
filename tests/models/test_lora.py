"""LoRA adapters against PEFT: our model with an adapter equals `peft.PeftModel` on the
transformers reference (float32), an adapter we write loads in PEFT and one PEFT writes loads
in ours."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memagent_jax.errors import UserError
from memagent_jax.models.loading import build_model, load_model
from memagent_jax.models.lora import init_adapters, merge, read_peft, write_peft
from memagent_jax.models.lora_config import LoraConfig
from memagent_jax.models.qwen import split_params
from tests.hf_reference import hf_logits, hf_model, write_hf_model

TOL = 1e-4
IDS = np.random.RandomState(0).randint(0, 101, (2, 24))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(HF directory, our model loaded from it, its config)."""
    path = write_hf_model(tmp_path_factory.mktemp("base") / "hf", seed=3)
    model, config = load_model(path)
    return path, model, config


def _greedy(step, ids: np.ndarray, new: int = 4) -> np.ndarray:
    """new greedy tokens after ids [B, T]; step(ids) -> logits [B, T, V]."""
    for _ in range(new):
        ids = np.concatenate([ids, np.asarray(step(ids))[:, -1].argmax(-1)[:, None]], axis=1)
    return ids


def _peft_greedy(model, ids: np.ndarray) -> np.ndarray:
    return _greedy(lambda x: hf_logits(model, x), ids)


@pytest.mark.slow
def test_our_adapter_loads_in_peft(base, tmp_path):
    from peft import PeftModel

    path, model, config = base
    lora = LoraConfig(rank=4, alpha=8.0)
    adapters = init_adapters(config, lora, seed=0)
    # B starts at zero (the adapted model is the base): perturb it so the adapter matters.
    leaves, tree = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    adapters = jax.tree_util.tree_map_with_path(
        lambda p, x, k: x if p[-1].key == "a" else 0.3 * jax.random.normal(k, x.shape),
        adapters, jax.tree.unflatten(tree, list(keys)))
    write_peft(adapters, config, lora, str(tmp_path / "adapter"), base_model=path)
    merged = build_model(config, merge(split_params(model)[1], adapters, lora.scale))

    peft_model = PeftModel.from_pretrained(hf_model(seed=3), str(tmp_path / "adapter")).eval()
    ours = np.asarray(merged(jnp.asarray(IDS)))
    theirs = hf_logits(peft_model, IDS)
    assert np.abs(ours - hf_logits(hf_model(seed=3), IDS)).max() > 0.1  # the adapter acts
    assert np.abs(ours - theirs).max() <= TOL
    np.testing.assert_array_equal(_greedy(lambda x: merged(jnp.asarray(x)), IDS),
                                  _peft_greedy(peft_model, IDS))


@pytest.fixture(scope="module")
def peft_adapter(base, tmp_path_factory):
    """(PEFT's adapter directory, the PeftModel that wrote it): rank 4 on q, v, o, up and down
    (k and gate left out), B drawn at random."""
    import torch
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_model = get_peft_model(hf_model(seed=3), PeftLoraConfig(
        r=4, lora_alpha=12, target_modules=["q_proj", "v_proj", "o_proj", "up_proj",
                                            "down_proj"], lora_dropout=0.0))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    out = str(tmp_path_factory.mktemp("peft") / "adapter")
    peft_model.save_pretrained(out)
    return out, peft_model.eval()


def test_peft_adapter_loads_in_ours(base, peft_adapter):
    path, _, config = base
    adapter_dir, peft_model = peft_adapter
    lora, _ = read_peft(adapter_dir, config)
    assert (lora.rank, lora.alpha, lora.targets) == (4, 12.0, ("q", "v", "o", "up", "down"))
    model, _ = load_model(path, lora=adapter_dir)
    ours = np.asarray(model(jnp.asarray(IDS)))
    assert np.abs(ours - hf_logits(hf_model(seed=3), IDS)).max() > 0.1
    assert np.abs(ours - hf_logits(peft_model, IDS)).max() <= TOL
    np.testing.assert_array_equal(_greedy(lambda x: model(jnp.asarray(x)), IDS),
                                  _peft_greedy(peft_model, IDS))


@pytest.mark.parametrize("change, message", [
    ({"use_dora": True}, "use_dora True is not supported"),
    ({"r": 0}, "needs an integer r >= 1"),
])
def test_unsupported_adapter_is_one_line(base, peft_adapter, tmp_path, change, message):
    adapter_dir, _ = peft_adapter
    bad = tmp_path / "bad"
    bad.mkdir()
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        settings = json.load(f)
    (bad / "adapter_config.json").write_text(json.dumps({**settings, **change}))
    os.symlink(os.path.join(adapter_dir, "adapter_model.safetensors"),
               bad / "adapter_model.safetensors")
    with pytest.raises(UserError, match=message) as e:
        read_peft(str(bad), base[2])
    assert "\n" not in str(e.value)


def test_an_adapter_without_matrices_is_one_line(base, peft_adapter, tmp_path):
    from safetensors.numpy import save_file

    adapter_dir, _ = peft_adapter
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(os.path.join(adapter_dir, "adapter_config.json"), empty)
    save_file({}, str(empty / "adapter_model.safetensors"))
    with pytest.raises(UserError, match=r"adapter_model.safetensors: holds no LoRA matrix$"):
        read_peft(str(empty), base[2])


def test_adapter_of_another_model_is_refused(base, peft_adapter, tmp_path):
    adapter_dir, _ = peft_adapter
    other = base[2].replace(hidden_size=48)
    with pytest.raises(UserError, match="has shape .* this base needs"):
        read_peft(adapter_dir, other)


def test_export_merges_an_adapter_that_transformers_loads(base, peft_adapter, tmp_path):
    import transformers

    from memagent_jax.cli import main
    path, _, _ = base
    adapter_dir, peft_model = peft_adapter
    out = str(tmp_path / "merged")
    assert main(["export", "--model", path, "--lora", adapter_dir, "--out", out]) == 0
    merged = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert np.abs(hf_logits(merged, IDS) - hf_logits(peft_model, IDS)).max() <= TOL


@pytest.mark.parametrize("flags, message", [
    (["--lora", "{tmp}"], "--lora: '{tmp}' is not a PEFT adapter directory"),
    (["--merged"], "--merged: {base} is no LoRA training run's checkpoint"),
])
def test_a_bad_export_flag_is_one_line(base, tmp_path, capsys, flags, message):
    from memagent_jax.cli import main
    fill = {"tmp": str(tmp_path), "base": base[0]}
    assert main(["export", "--model", base[0], *[f.format(**fill) for f in flags],
                 "--out", str(tmp_path / "out")]) != 0
    assert message.format(**fill) in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "out")


def test_model_section_loads_an_adapter_and_names_a_bad_one(base, peft_adapter, tmp_path):
    from memagent_jax.engine.factory import load_model_section
    from memagent_jax.engine.model_section import ModelSection
    from memagent_jax.errors import ConfigError
    path, _, _ = base
    adapter_dir, peft_model = peft_adapter
    loaded = load_model_section(ModelSection(path=path, lora=adapter_dir), None)
    ours = np.asarray(loaded.model(jnp.asarray(IDS)))
    assert np.abs(ours - hf_logits(peft_model, IDS)).max() <= TOL
    with pytest.raises(ConfigError, match="not a PEFT adapter directory") as e:
        ModelSection(path=path, lora=str(tmp_path)).load_tokenizer(required=False)
    assert e.value.key == "model.lora"
