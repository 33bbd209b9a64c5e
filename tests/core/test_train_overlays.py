"""configs/train/: a model's recipe in one file (qwen2.5-7b.yaml, qwen3-4b.yaml), and each
target a short file naming it as its `base` and giving only the hardware (mesh, attention,
decode slots and prefill rows, micro-batch, remat, where the run's files go). Each target
resolves to the values the table below states (written out here, not read from the files);
every other field is the recipe's and the same on both of a model's targets; each key a target
gives is needed (without it the config is not the target's)."""

import dataclasses
import os
import shutil

import pytest
import yaml

from memagent_jax.rl.config import load_train_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "configs", "train")

RECIPES = {"qwen2.5-7b.yaml": ("qwen2.5-7b_gpu8.yaml", "qwen2.5-7b_tpu_v5p.yaml"),
           "qwen3-4b.yaml": ("qwen3-4b_gpu8.yaml", "qwen3-4b_tpu_v5p.yaml")}

# What each target resolves to where the targets differ (and where its run's files go).
TARGETS = {
    "qwen2.5-7b_gpu8.yaml": {
        "model.path": "~/ckpt/qwen2.5-7b", "model.attention": "cudnn",
        "mesh": {"data": 2, "fsdp": 2, "tensor": 2},
        "engine.slots": 128, "engine.prefill_rows": 4,
        "learner.micro_batch_tokens": 33792, "learner.remat": "full",
        "checkpoint.dir": None, "output_dir": "runs/qwen2.5-7b_gpu8",
        "compilation_cache_dir": "runs/jax_cache", "distributed": False},
    "qwen2.5-7b_tpu_v5p.yaml": {
        "model.path": "~/models/Qwen2.5-7B-Instruct", "model.attention": "splash",
        "mesh": {"data": 4, "fsdp": 8, "tensor": 1},
        "engine.slots": 512, "engine.prefill_rows": 32,
        "learner.micro_batch_tokens": 270336, "learner.remat": "matmuls",
        "checkpoint.dir": "gs://BUCKET/runs/qwen2.5-7b_tpu_v5p/checkpoints",
        "output_dir": "runs/qwen2.5-7b_tpu_v5p",
        "compilation_cache_dir": "gs://BUCKET/jax_cache", "distributed": True},
    "qwen3-4b_gpu8.yaml": {
        "model.path": "~/ckpt/qwen3-4b", "model.attention": "cudnn",
        "mesh": {"data": 2, "fsdp": 1, "tensor": 4},
        "engine.slots": 96, "engine.prefill_rows": 2,
        "learner.micro_batch_tokens": 33792, "learner.remat": "matmuls",
        "checkpoint.dir": None, "output_dir": "runs/qwen3-4b_gpu8",
        "compilation_cache_dir": "runs/jax_cache", "distributed": False},
    "qwen3-4b_tpu_v5p.yaml": {
        "model.path": "~/ckpt/qwen3-4b", "model.attention": "splash",
        "mesh": {"data": 4, "fsdp": 1, "tensor": 4},
        "engine.slots": 256, "engine.prefill_rows": 4,
        "learner.micro_batch_tokens": 67584, "learner.remat": "matmuls",
        "checkpoint.dir": "gs://BUCKET/runs/qwen3-4b_tpu_v5p/checkpoints",
        "output_dir": "runs/qwen3-4b_tpu_v5p",
        "compilation_cache_dir": "gs://BUCKET/jax_cache", "distributed": True},
}
TARGET_KEYS = set(TARGETS["qwen2.5-7b_gpu8.yaml"])
RECIPE_OF = {target: recipe for recipe, targets in RECIPES.items() for target in targets}
MAX_KEY_LINES = 20  # a target's lines that are not comments or blank


def _flat(value, prefix=""):
    """Dotted keys to leaf values; `mesh` is one value (a target gives it whole)."""
    if isinstance(value, dict) and prefix != "mesh.":
        out = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: value}


def _resolved(path) -> dict:
    return _flat(dataclasses.asdict(load_train_config(path)))


def _expected(target) -> dict:
    return {k: os.path.expanduser(v) if k == "model.path" else v
            for k, v in TARGETS[target].items()}


def _raw_keys(path) -> set:
    with open(path, encoding="utf-8") as f:
        return set(_flat(yaml.safe_load(f))) - {"base"}


def test_every_model_config_in_train_is_a_recipe_or_one_of_its_targets():
    names = {n for n in os.listdir(TRAIN) if n.endswith(".yaml")}
    assert set(RECIPES) | set(TARGETS) <= names
    assert names - set(RECIPES) - set(TARGETS) == {"tiny_cpu.yaml", "tiny_cpu_lora.yaml",
                                                   "qwen2.5-7b_tpu_v5e_lora.yaml",
                                                   "qwen2.5-7b_tpu_v6e_lora.yaml"}


@pytest.mark.parametrize("target", list(TARGETS))
def test_a_target_names_its_recipe_and_resolves_to_the_table(target):
    path = os.path.join(TRAIN, target)
    with open(path, encoding="utf-8") as f:
        assert yaml.safe_load(f)["base"] == RECIPE_OF[target]
    resolved = _resolved(path)
    assert {k: resolved[k] for k in TARGET_KEYS} == _expected(target)
    # Everything else is the recipe's.
    recipe = _resolved(os.path.join(TRAIN, RECIPE_OF[target]))
    assert set(resolved) == set(recipe)
    assert {k: v for k, v in resolved.items() if k not in TARGET_KEYS} == {
        k: v for k, v in recipe.items() if k not in TARGET_KEYS}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_a_models_two_targets_differ_only_in_the_tables_keys(recipe):
    gpu, tpu = (_resolved(os.path.join(TRAIN, t)) for t in RECIPES[recipe])
    assert set(gpu) == set(tpu) and len(gpu) > 60
    assert {k for k in gpu if gpu[k] != tpu[k]} <= TARGET_KEYS
    assert {k: v for k, v in gpu.items() if k not in TARGET_KEYS} == {
        k: v for k, v in tpu.items() if k not in TARGET_KEYS}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_a_recipe_gives_no_hardware_and_loads_on_the_schemas_defaults(recipe):
    path = os.path.join(TRAIN, recipe)
    assert not (_raw_keys(path) & TARGET_KEYS) - {"model.path"}
    resolved = _resolved(path)
    defaults = _flat(dataclasses.asdict(load_train_config(
        None, ["model.path=x", "data.train=[x]", "data.val=x"])))
    assert {k: resolved[k] for k in TARGET_KEYS - {"model.path"}} == {
        k: defaults[k] for k in TARGET_KEYS - {"model.path"}}
    # and the original's hyper-parameters (docs/algorithm.md section 3)
    assert (resolved["prompts_per_step"], resolved["rollout.n"], resolved["steps"]) == (
        128, 16, 400)
    assert (resolved["learner.lr"], resolved["learner.mini_batches"],
            resolved["learner.kl_coef"]) == (1e-6, 16, 0.001)


@pytest.mark.parametrize("target", list(TARGETS))
def test_a_target_is_short_and_gives_only_the_hardware(target):
    path = os.path.join(TRAIN, target)
    assert _raw_keys(path) <= TARGET_KEYS
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    keys = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    assert len(keys) <= MAX_KEY_LINES, keys
    recipe = os.path.join(TRAIN, RECIPE_OF[target])
    while True:  # the recipe's whole file (qwen3-4b.yaml is itself an overlay of the 7B one)
        with open(recipe, encoding="utf-8") as f:
            text = f.read()
        base = yaml.safe_load(text).get("base")
        if base is None:
            break
        recipe = os.path.join(os.path.dirname(recipe), base)
    assert len(lines) < len(text.splitlines())


@pytest.mark.parametrize("target", list(TARGETS))
def test_each_key_a_target_gives_is_needed(target, tmp_path):
    """Without any one of its keys the target no longer resolves to its table row (so none
    repeats the recipe's value, and the table test would catch a dropped key)."""
    for recipe in {RECIPE_OF[target], "qwen2.5-7b.yaml"}:  # qwen3-4b.yaml's base too
        shutil.copy(os.path.join(TRAIN, recipe), tmp_path)
    with open(os.path.join(TRAIN, target), encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    given = sorted(_raw_keys(os.path.join(TRAIN, target)))
    assert given
    for key in given:
        cut = yaml.safe_load(yaml.safe_dump(raw))
        *sections, leaf = key.split(".")
        node = cut
        for section in sections:
            node = node[section]
        del node[leaf]
        path = tmp_path / target
        path.write_text(yaml.safe_dump(cut))
        resolved = _resolved(str(path))
        assert {k: resolved[k] for k in TARGET_KEYS} != _expected(target), key
