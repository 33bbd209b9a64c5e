"""What `memagent-jax train` keeps in its run directory and says before it starts: the resolved
config (config.yaml, which reruns as it is), a resume refused when it changes other settings
than those a resume may change, and the block saying what the run is about to do. Each test
stops the trainer where it would start building the model: no device work."""

import copy
import functools
import os

import pytest
import yaml

from memagent_jax.cli import main
from memagent_jax.data.needle import write_task
from memagent_jax.distributed import startup
from memagent_jax.rl.config import RESUMABLE, load_train_config
from memagent_jax.rl.trainer import Trainer
from memagent_jax.runconfig import differences, to_dict

PREFIX = "memagent-jax: error: "


class _Built(Exception):
    """The trainer got as far as building the model."""


@pytest.fixture(autouse=True)
def stop_at_build(monkeypatch):
    def build(self):
        raise _Built
    monkeypatch.setattr(Trainer, "_build", build)


@pytest.fixture
def config_file(tmp_path):
    task = write_task(str(tmp_path / "task"), train_size=8, val_size=2)
    config = {"model": {"preset": "tiny", "tokenizer": task["tokenizer"]},
              "mesh": {"data": 1, "fsdp": -1, "tensor": 1},
              "data": {"train": [task["train"]], "val": task["val"]},
              "memagent": {"chunk_tokens": 32, "max_memory_tokens": 8, "max_final_tokens": 8,
                           "max_problem_tokens": 8},
              "engine": {"slots": 8},
              "rollout": {"n": 2},
              "learner": {"lr": 1e-3, "micro_batch_tokens": 2048, "bucket_lengths": [256]},
              "steps": 4, "prompts_per_step": 2, "output_dir": str(tmp_path / "run")}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _train(config_file, *overrides) -> int | str:
    """`memagent-jax train`: its exit status, or "built" where it reached the model."""
    try:
        return main(["train", "--config", config_file, *overrides])
    except _Built:
        return "built"


def test_the_run_keeps_its_resolved_config_which_reruns_as_it_is(config_file, tmp_path):
    assert _train(config_file, "learner.lr=3e-4") == "built"
    kept = tmp_path / "run" / "config.yaml"
    assert kept.read_text().startswith("# The resolved config of this run")
    config = load_train_config(config_file, ["learner.lr=3e-4"])
    assert load_train_config(str(kept)) == config
    assert _train(str(kept)) == "built"
    assert load_train_config(str(kept)) == config


def test_a_resume_with_other_settings_is_refused_naming_each_change(config_file, tmp_path,
                                                                   capsys):
    assert _train(config_file) == "built"
    kept = tmp_path / "run" / "config.yaml"
    started = kept.read_text()
    # Before any checkpoint there is nothing to resume: a run may start over with others.
    assert _train(config_file, "learner.lr=3e-4") == "built"
    assert _train(config_file) == "built"
    (tmp_path / "run" / "checkpoints" / "2").mkdir(parents=True)  # a committed step
    capsys.readouterr()
    assert _train(config_file, "learner.lr=3e-4", "rollout.n=4", "steps=8") == 2
    err = capsys.readouterr().err
    assert err.startswith(PREFIX) and err.count("\n") == 1, err
    assert (f"{tmp_path / 'run'}: resuming a run started with other settings (rollout.n was "
            "2, now 4; learner.lr was 0.001, now 0.0003); rerun with the settings of "
            f"{kept}, or give another output_dir (a resume may change only "
            f"{', '.join(RESUMABLE)})") in err
    assert kept.read_text() == started  # the run's config is left as it was


# Each key a resume may change (rl/config.py RESUMABLE, written out again here so that a key
# dropped from it or added to it shows), with a change of it ({tmp}: the test's directory).
RESUMED = {"steps": "steps=10", "checkpoint.every": "checkpoint.every=1",
           "checkpoint.keep": "checkpoint.keep=5",
           "checkpoint.async_save": "checkpoint.async_save=false",
           "validation.every": "validation.every=2",
           "validation.at_start": "validation.at_start=true",
           "output_dir": "output_dir={tmp}/moved",  # the run directory moved
           "mesh": "mesh={{data: 2, fsdp: -1, tensor: 1}}",
           "distributed": "distributed=true",
           "compilation_cache_dir": "compilation_cache_dir={tmp}/cache",
           "engine.slots": "engine.slots=16",
           "learner.micro_batch_tokens": "learner.micro_batch_tokens=1024",
           "learner.remat": "learner.remat=full",
           "log": "log.rollouts_every=3"}


@pytest.mark.parametrize("key", RESUMED)
def test_a_resume_may_run_longer_checkpoint_validate_and_sit_on_the_machine_otherwise(
        config_file, tmp_path, monkeypatch, key):
    monkeypatch.setattr(startup, "start", lambda *args: None)  # distributed=true: no job
    change = RESUMED[key].format(tmp=tmp_path)
    assert load_train_config(config_file, [change]) != load_train_config(config_file)
    assert _train(config_file) == "built"
    run = tmp_path / "run"
    (run / "checkpoints" / "2").mkdir(parents=True)
    if key == "output_dir":
        run = run.rename(tmp_path / "moved")
    assert _train(config_file, change) == "built"
    assert load_train_config(str(run / "config.yaml")) == load_train_config(
        config_file, [change])  # kept as the run now is


def test_a_resume_checks_every_other_key(config_file):
    """The config's keys fall in two: those a resume may change (RESUMED, and the keys under
    them) and every other, whose change the resume's check names."""
    assert set(RESUMABLE) == set(RESUMED)
    started = to_dict(load_train_config(config_file))
    kept = [key for key in _keys(started)
            if not any(key == k or key.startswith(k + ".") for k in RESUMED)]
    assert len(kept) > 50, kept  # every section's
    for key in kept + list(RESUMED):
        *path, name = key.split(".")
        changed = copy.deepcopy(started)
        section = functools.reduce(dict.__getitem__, path, changed)
        was, section[name] = section[name], "changed"  # KeyError: no such key
        expected = [] if key in RESUMED else [f"{key} was {was!r}, now 'changed'"]
        assert differences(started, changed, RESUMABLE) == expected, key


def _keys(tree: dict) -> list[str]:
    """The dotted keys of a config as plain data (`to_dict`) down to its values that are no
    section."""
    return [f"{name}.{key}" if key else name
            for name, value in tree.items()
            for key in (_keys(value) if isinstance(value, dict) and value else [""])]


def test_the_run_says_what_it_is_about_to_do(config_file, tmp_path, capsys):
    assert _train(config_file) == "built"
    block = capsys.readouterr().err.split("\n")
    task = tmp_path / "task"
    assert block[:7] == [
        "train",
        "  model    preset tiny, random weights (init_seed 0)",
        f"  data     {task / 'train.parquet'} (8 rows); validation {task / 'val.parquet'} (2 "
        "rows used)",
        "  devices  8 cpu device(s) in 1 process(es), mesh data 1 x fsdp 8 x tensor 1",
        "  agent    memagent: chunks of 32 tokens (at most 8 a document), memory 8, final "
        "answer 8; 8 decode slots",
        "  steps    4 (dapo), each 2 prompts x 2 trajectories",
        f"  run dir  {tmp_path / 'run'} (config.yaml; checkpoints "
        f"{os.path.join(tmp_path / 'run', 'checkpoints')}, logs "
        f"{os.path.join(tmp_path / 'run', 'logs')})"], block


@pytest.mark.parametrize("overrides, message", [
    (["learner.lrr=1e-6"], "override 'learner.lrr=1e-6': unknown key 'learner.lrr' (did you "
                           "mean 'learner.lr'?)"),
    (["data.train=[{doc}]"], "data.train[0]: '{doc}' is a .txt file; training data is read "
                             "from parquet, json or jsonl files (a file, a directory of them, "
                             "or a hub id such as BytedTsinghua-SIA/hotpotqa)"),
    (["data.train=[{tmp}]"], "data.train[0]: '{tmp}' is a directory without any .parquet, "
                             ".json or .jsonl file"),
])
def test_bad_input_names_what_to_do(config_file, tmp_path, capsys, overrides, message):
    (tmp_path / "empty").mkdir()
    doc = tmp_path / "empty" / "doc.txt"
    doc.write_text("a document\n")
    names = {"doc": doc, "tmp": tmp_path / "empty"}
    assert _train(config_file, *(o.format(**names) for o in overrides)) == 2
    assert capsys.readouterr().err == f"{PREFIX}{message.format(**names)}\n"


def test_an_eval_config_given_to_train_is_named_as_one(capsys):
    path = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "eval",
                        "tiny_cpu.yaml")
    assert _train(path) == 2
    assert capsys.readouterr().err == (
        f"{PREFIX}{path}: a config for `memagent-jax eval` (it has 'method', 'full_context', "
        "'sampling', ...), not for `memagent-jax train`: run it with `memagent-jax eval "
        "--config`\n")
