"""The synthetic recipe's DAPO steps and step 6 as shipped (configs/synthetic_rl_carry_cut.yaml,
the shipped model's DAPO, step 5d, which is step 5's synthetic_rl_carry_pool.yaml from another
checkpoint, and the variants synthetic_rl.yaml and synthetic_rl_starts.yaml, then
configs/eval_synthetic.yaml), a couple of steps each on small data, so that CI keeps the
recipe runnable (steps 0-4d, the supervised warm-up, are tests/test_sft.py's). The model is
the recipe's shape (preset `small`) with random weights in place of step 4's or 4d's
checkpoint; training runs on one CPU device as the recipe does, in a process of its own (this
one has 8)."""

import json
import os

import numpy as np
import pytest

from memagent_jax.cli import main
from memagent_jax.rl.config import load_train_config

from tests import multiprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["synthetic_rl", "synthetic_rl_starts",
                                  "synthetic_rl_carry_cut"])
def test_the_rl_configs_run_dapo_through_the_memory_loop(name, tmp_path):
    """The configs with carry starts: one of the two prompts a step a carry start (2 chunks of
    the 4 hardest; rl/carry_starts.py)."""
    path = os.path.join(CONFIGS, f"{name}.yaml")
    starts = load_train_config(path).rollout.carry_starts > 0
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
         *(["rollout.carry_starts=1", "rollout.carry_chunks=2", "rollout.carry_pool=2"]
           if starts else [])],
        num_processes=1, timeout_s=300, devices=1))
    with open(out / "logs" / "steps.jsonl") as f:
        records = [json.loads(line) for line in f]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["rollout/trajectories"] == 8 and r["rollout/turns"] == 3  # 2 chunks + answer
        assert np.isfinite(r["learner/loss"]) and r["learner/clip_fraction"] >= 0
        assert ("reward/carry_start_mean" in r) == starts
        assert len(r["examples"]) == (1 if starts else 2)
    assert "val/accuracy" in records[1]
    assert (out / "checkpoints" / "2").is_dir()
    # the budgets it trained with travel with the model (run and demo default to them)
    budgets = json.loads((out / "checkpoints" / "model" / "hf_files" / "memagent.json")
                         .read_text())
    assert budgets == {"chunk_tokens": 256, "max_memory_tokens": 40, "max_final_tokens": 20,
                       "max_problem_tokens": 16}


@pytest.mark.slow
def test_the_eval_config_tables_a_model_over_lengths(tmp_path):
    data = tmp_path / "data"
    assert main(["data", "synthetic", "--task", "multikey", "--lengths", "512", "2048",
                 "--num-samples", "4", "--seed", "9", "--out", str(data)]) == 0
    out = tmp_path / "eval"
    assert main(["eval", "--config", os.path.join(CONFIGS, "eval_synthetic.yaml"),
                 "model.path=null", "model.preset=small", f"model.tokenizer={data}/tokenizer",
                 f"data.sets=[{data}/eval_multikey_512.json, {data}/eval_multikey_2048.json]",
                 f"output_dir={out}"]) == 0
    table = json.loads((out / "table.json").read_text())
    assert (out / "accuracy.png").is_file()
    assert table["columns"] == ["512", "2K"]
    assert [(r["model"], r["method"]) for r in table["rows"]] == [("sft+rl", "memagent")]
    for name in ("eval_multikey_512", "eval_multikey_2048"):
        lines = (out / "samples" / f"{name}.jsonl").read_text().splitlines()
        assert len(lines) == 4 and all(json.loads(l)["turns"] > 1 for l in lines)
