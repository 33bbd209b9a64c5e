"""The synthetic recipe's DAPO step as shipped (configs/synthetic/08_dapo.yaml) for a couple of
steps on small data, so that CI keeps the recipe runnable (steps 00-07, the supervised
warm-up, are tests/e2e/test_recipe_warmup.py's), and the memagent-tiny eval config as
written. The DAPO step's model is the recipe's shape (preset `small`) with random weights in
place of step 07's checkpoint; training runs on one CPU device as the recipe does, in a
process of its own (this one has 8)."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from memagent_jax.cli import main
from memagent_jax.rl.config import load_train_config
from tests import multiprocess

ROOT = str(Path(__file__).resolve().parents[2])
CONFIGS = os.path.join(ROOT, "configs")


@pytest.mark.slow
def test_the_dapo_config_runs_dapo_through_the_memory_loop(tmp_path):
    """One of the two prompts a step a carry start (2 chunks of the 4 hardest;
    synthetic/carry_starts.py)."""
    path = os.path.join(CONFIGS, "synthetic", "08_dapo.yaml")
    assert load_train_config(path).plugin["carry_starts"] > 0
    data = tmp_path / "data"
    for task in ("multikey", "twohop"):
        assert main(["data", "synthetic", "--task", task, "--lengths", "400", "--num-samples",
                     "8", "--layout", "train", "--seed", "3", "--out", str(data)]) == 0
    assert main(["data", "synthetic", "--task", "twohop", "--lengths", "700", "--num-samples",
                 "2", "--seed", "2", "--out", str(data)]) == 0
    out = tmp_path / "run"
    multiprocess.check_ok(multiprocess.run(
        ["train", "--config", path, "model.path=null",
         "model.preset=small", f"model.tokenizer={data}/tokenizer",
         f"data.train=[{data}/train_multikey.parquet, {data}/train_twohop.parquet]",
         f"data.val={data}/eval_twohop_700.json", "validation.size=2", "validation.every=2",
         "steps=2", "prompts_per_step=2", "rollout.n=4", "engine.slots=8",
         "dynamic_sampling.enabled=false", f"output_dir={out}", "compilation_cache_dir=null",
         "plugin.carry_starts=1", "plugin.start_chunks=2", "plugin.start_pool=2"],
        num_processes=1, timeout_s=300, devices=1))
    with open(out / "logs" / "steps.jsonl") as f:
        records = [json.loads(line) for line in f]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["rollout/trajectories"] == 8 and r["rollout/turns"] == 3  # 2 chunks + answer
        assert np.isfinite(r["learner/loss"]) and r["learner/clip_fraction"] >= 0
        assert "reward/starts_mean" in r
        assert len(r["examples"]) == 1  # the other prompt is the carry start
    assert "val/accuracy" in records[1]
    assert (out / "checkpoints" / "2").is_dir()
    # the budgets it trained with travel with the model (run and demo default to them)
    budgets = json.loads((out / "checkpoints" / "model" / "hf_files" / "memagent.json")
                         .read_text())
    assert budgets == {"chunk_tokens": 256, "max_memory_tokens": 40, "max_final_tokens": 20,
                       "max_problem_tokens": 16, "thinking": "keep"}


@pytest.mark.slow
def test_the_memagent_tiny_eval_config_runs_as_written(tmp_path, monkeypatch):
    """In a directory of its own, as on a fresh clone: the shipped model by name, the sets the
    config's header writes (two short documents of them here), no other override."""
    monkeypatch.chdir(tmp_path)
    assert main(["data", "synthetic", "--task", "multikey", "--lengths", "1024",
                 "--num-samples", "2", "--seed", "9", "--out", "data/synthetic_eval"]) == 0
    config = os.path.join(CONFIGS, "eval", "memagent_tiny.yaml")
    assert main(["eval", "--config", config,
                 "data.sets=[data/synthetic_eval/eval_multikey_1024.json]"]) == 0
    out = tmp_path / "results" / "memagent_tiny_multikey"
    table = json.loads((out / "table.json").read_text())
    assert table["columns"] == ["1K"]
    assert [(r["model"], r["method"]) for r in table["rows"]] == [("memagent-tiny", "memagent")]
    samples = [json.loads(line) for line in
               (out / "samples" / "eval_multikey_1024.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and all(s["turns"] == 5 for s in samples)  # 4 chunks + answer
    assert all(s["em"] == 1.0 for s in samples)  # the shipped model reads both right
