"""The trainer's one door for an experiment (rl/plugin.py), through a plugin written here, not
the synthetic one: a supervised step trains on the plugin's targets and extra rows, a DAPO step
rolls out its starts from their given memory in place of drawn prompts (and its validation
read logs the plugin's metrics of it), and the plugin's section is checked as a config
section is."""

import json
import os

import jax
import pytest
import yaml

from memagent_jax.cli import main
from memagent_jax.data.needle import write_task
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.rl.config import load_train_config
from memagent_jax.rl.trainer import Trainer

pytestmark = pytest.mark.slow  # training runs

PLUGIN = "tests.rl.example_plugin"


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin")
    task = write_task(str(root / "task"), train_size=16, val_size=2, seed=3)
    config = {
        "model": {"preset": "tiny", "tokenizer": task["tokenizer"], "compute_dtype": "float32"},
        "data": {"train": [task["train"]]}, "reward": {"function": "contains"},
        "memagent": {"chunk_tokens": 32, "max_memory_tokens": 12, "max_final_tokens": 8,
                     "max_problem_tokens": 8},
        "engine": {"slots": 16, "prefill_buckets": [256]},
        "rollout": {"n": 2},
        "learner": {"lr": 1e-3, "warmup_steps": 0, "micro_batch_tokens": 4096,
                    "bucket_lengths": [256]},
        "steps": 1, "prompts_per_step": 3, "seed": 5,
        "compilation_cache_dir": os.environ["JAX_COMPILATION_CACHE_DIR"],
    }
    path = root / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _run(config_file, tmp_path, *overrides):
    trainer = Trainer(load_train_config(config_file, [f"output_dir={tmp_path}",
                                                      f"plugin.module={PLUGIN}", *overrides]))
    record = trainer.run()
    with open(tmp_path / "logs" / "steps.jsonl") as f:
        assert [json.loads(line)["step"] for line in f] == [1]
    return trainer, record


def test_a_supervised_step_trains_on_the_plugins_targets_and_extra_rows(config_file, tmp_path):
    trainer, record = _run(config_file, tmp_path, "learner.loss=sft", "plugin.extra=2")
    # 3 drawn examples, one final turn each (their targets answer right), and 2 extra rows
    assert record["learner/rows"] == 3 + 2 and record["reward/mean"] == 1.0
    assert len(record["examples"]) == 3 and record["rollout/turns"] == 1.0
    assert trainer.plugin.seeds == [5 * 1_000_003 + 1]  # a function of (seed, step) only


def test_a_dapo_step_rolls_out_the_plugins_starts_from_their_memory(config_file, tmp_path):
    """The plugin's own rollout (`StepContext.rollouts`) is the agent's on the step's runner
    under the step's parameters: the same trajectories as the runner gives them. The step's
    validation read logs the plugin's metrics of it."""
    before, run_trainer = {}, Trainer.run

    def run(trainer):
        before["params"] = jax.tree.map(lambda x: x.copy(), trainer.learner.params)
        return run_trainer(trainer)

    val = os.path.join(os.path.dirname(config_file), "task", "val.parquet")  # write_task's
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "run", run)
        trainer, record = _run(config_file, tmp_path, "plugin.starts=1", f"data.val={val}",
                               "validation.every=1", "validation.n=2")
    ((examples, groups),) = trainer.plugin.validated
    assert [e.question for e in examples] == [e.question for e in trainer.val_examples]
    assert len(examples) == 2 and [len(g) for g in groups] == [2, 2]
    turns = sum(len(t.turns) for g in groups for t in g)
    assert turns >= 2 * 2 * 2  # each read: at least a memory update and the final turn
    assert (record["val/trajectories"], record["val/turns"]) == (4.0, float(turns))
    with open(tmp_path / "logs" / "steps.jsonl") as f:
        assert json.loads(f.read())["val/turns"] == turns
    assert len(record["examples"]) == 2  # one of the three prompts is the plugin's start
    assert 0.0 <= record["reward/starts_mean"] <= 1.0
    assert record["rollout/trajectories"] == 3 * 2
    ((samples, rolled),) = trainer.plugin.rolled
    again = trainer.runner.with_params(before["params"]).run(trainer.agent, samples,
                                                             SamplingParams(0.0))
    assert [[t.response_ids for t in g[0].turns] for g in again] == [
        [t.response_ids for t in trajectory.turns] for trajectory in rolled]
    assert [t.kind for t in rolled[0].turns] == ["update", "final"]


def test_a_dapo_run_without_a_plugin_logs_no_starts(config_file, tmp_path):
    trainer = Trainer(load_train_config(config_file, [f"output_dir={tmp_path}"]))
    assert trainer.plugin is None
    assert "reward/starts_mean" not in trainer.run()


def test_the_plugins_section_is_checked_as_a_config_section(config_file, capsys):
    assert main(["train", "--config", config_file, f"plugin.module={PLUGIN}",
                 "plugin.extras=2"]) == 2
    err = capsys.readouterr().err
    assert err == (f"memagent-jax: error: {config_file}: unknown key 'plugin.extras' (did you "
                   "mean 'plugin.extra'?)\n")

