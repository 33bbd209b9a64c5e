"""The synthetic recipe's supervised warm-up as shipped (configs/synthetic/00-07):
training steps through the trainer, all seven in one process of their own. (The DAPO step and the
memagent-tiny eval config are tests/e2e/test_recipe.py's.)"""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from memagent_jax.cli import main
from memagent_jax.rl.config import load_train_config
from memagent_jax.synthetic import tasks as synthetic
from tests import multiprocess

ROOT = str(Path(__file__).resolve().parents[2])


@pytest.fixture(scope="module")
def recipe_data(tmp_path_factory):
    data = tmp_path_factory.mktemp("data")
    for task in synthetic.TASKS:
        assert main(["data", "synthetic", "--task", task, "--lengths", "200", "400",
                     "--num-samples", "8", "--layout", "train", "--out", str(data)]) == 0
    assert main(["data", "synthetic", "--task", "multikey", "--lengths", "1024",
                 "--num-samples", "4", "--seed", "2", "--out", str(data)]) == 0
    return data


SFT_STEPS = ["00_copy", "01_oracle", "02_copy_far", "03_copy_anywhere", "04_facts", "05_carry",
             "07_carry_cut"]
VALIDATES = "03_copy_anywhere"  # one config validates: time


def _rows(name) -> tuple[int, int, int, int]:
    """The config's copy, recall, fact and carry rows a step, cut to 8, 8, 8 and 4."""
    config = load_train_config(os.path.join(ROOT, "configs", "synthetic", f"{name}.yaml"))
    return tuple(min(config.plugin.get(f"{kind}_rows", 0), most)
                 for kind, most in (("copy", 8), ("recall", 8), ("fact", 8), ("carry", 4)))


# Each config's `train`, one after the other in one process: the configs share most of their
# compiled programs, which a child of its own for each would compile again.
_TRAIN_EACH = """
import json, sys, traceback
from memagent_jax.cli import main
codes = {}
for name, argv in json.loads(sys.argv[1]).items():
    print(f"== {name}", file=sys.stderr, flush=True)
    try:
        codes[name] = main(argv)
    except BaseException:
        traceback.print_exc()
        codes[name] = "raised"
print(json.dumps(codes))
"""


@pytest.fixture(scope="module")
def recipe_runs(recipe_data, tmp_path_factory):
    """{config name: (exit status, output directory)}, and the child's stderr."""
    data, root = recipe_data, tmp_path_factory.mktemp("recipe")
    commands = {}
    for name in SFT_STEPS:
        path = os.path.join(ROOT, "configs", "synthetic", f"{name}.yaml")
        start = [] if load_train_config(path).model.preset else ["model.path=null",
                                                                 "model.preset=small"]
        copies, recalls, facts, carries = _rows(name)
        commands[name] = [
            "train", "--config", path, *start, f"model.tokenizer={data}/tokenizer",
            f"data.train=[{data}/train_multikey.parquet, {data}/train_twohop.parquet]",
            f"data.val={data}/eval_multikey_1024.json", "validation.size=4",
            f"validation.every={2 if name == VALIDATES else 0}", f"plugin.copy_rows={copies}",
            f"plugin.recall_rows={recalls}", f"plugin.fact_rows={facts}",
            f"plugin.carry_rows={carries}", "plugin.carry_pool=4", "steps=2",
            "prompts_per_step=2", f"output_dir={root / name}", "compilation_cache_dir=null"]
    (result,) = multiprocess.run(["-c", _TRAIN_EACH, json.dumps(commands)], num_processes=1,
                                 timeout_s=900, devices=1)
    codes = json.loads(result.stdout.strip().splitlines()[-1]) if result.returncode == 0 else {}
    return {name: (codes.get(name), root / name) for name in SFT_STEPS}, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", SFT_STEPS)
def test_the_shipped_sft_configs_train_and_validate_through_the_memory_loop(recipe_runs, name):
    """The recipe's supervised steps as shipped, for two steps each, on one CPU device as the
    recipe runs (a process of its own: this one has 8); steps 01-07 start from a random model
    of the recipe's shape in place of the previous step's checkpoint. (Copy, recall and fact
    rows are cut to 8 a step here, carry rows to 4 of 16, and one config validates: time.
    Step 06's config runs as the base of step 07's, whose own keys are its learning rate,
    carry rows and cut chunks: with carry rows cut to 4 of 16, 06 alone would run as 05.)"""
    runs, stderr = recipe_runs
    code, out = runs[name]
    if code != 0:
        own = stderr.split(f"== {name}\n", 1)[-1].split("\n== ", 1)[0]
        raise AssertionError(f"{name} exited {code}:\n{own[-6000:]}")
    with open(out / "logs" / "steps.jsonl") as f:
        records = [json.loads(line) for line in f]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["reward/mean"] == 1.0 for r in records)  # the oracle answers right
    # every oracle turn (2 or 3 a document), the config's copy, recall, fact and carry rows
    extra = sum(_rows(name))
    assert extra and all(2 * 2 + extra <= r["learner/rows"] <= 2 * 3 + extra for r in records)
    assert all(np.isfinite(r["learner/loss"]) for r in records)
    assert records[0]["learner/lr"] == 0.0 < records[1]["learner/lr"]  # warm-up
    assert ("val/accuracy" in records[1]) == (name == VALIDATES)
    assert (out / "checkpoints" / "2").is_dir()
