"""`memagent-jax train` configs: the shipped YAML files, overrides, and bad input, each caught
with one clear line before any model is loaded; and the command stopped by SIGTERM or Ctrl-C,
then resumed."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from memagent_jax.cli import main
from memagent_jax.data.needle import write_task
from memagent_jax.errors import UserError
from memagent_jax.rl.build import build_run
from memagent_jax.rl.config import check_devices, load_train_config
from memagent_jax.rl.trainer import Trainer
from memagent_jax.runconfig import check
from tests import multiprocess
from tests.builders import block_package

CONFIGS = os.path.join(Path(__file__).resolve().parents[2], "configs")
PREFIX = "memagent-jax: error: "


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    """A valid tiny config over the needle task."""
    root = tmp_path_factory.mktemp("cfg")
    task = write_task(str(root / "task"), train_size=8, val_size=2)
    config = {"model": {"preset": "tiny", "tokenizer": task["tokenizer"]},
              "data": {"train": [task["train"]], "val": task["val"]},
              "memagent": {"chunk_tokens": 32, "max_memory_tokens": 8, "max_final_tokens": 8,
                           "max_problem_tokens": 8},
              "engine": {"slots": 8},
              "rollout": {"n": 2},
              "learner": {"micro_batch_tokens": 2048, "bucket_lengths": [256]},
              "steps": 1, "prompts_per_step": 2, "output_dir": str(root / "run"),
              "compilation_cache_dir": os.environ["JAX_COMPILATION_CACHE_DIR"]}
    path = root / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.fixture
def no_device_work(monkeypatch):
    """Fails the test if the trainer gets as far as building models or compiling."""
    def forbidden(self):
        raise AssertionError("device work started before the input was checked")
    monkeypatch.setattr(Trainer, "_build", forbidden)


DEVICES = {"tiny_cpu.yaml": 1, "qwen2.5-7b_gpu8.yaml": 8, "qwen2.5-7b_tpu_v5p.yaml": 32,
           "qwen3-4b_gpu8.yaml": 8, "qwen3-4b_tpu_v5p.yaml": 16}


@pytest.mark.parametrize("name", list(DEVICES))
def test_shipped_configs_load_and_validate(name):
    config = load_train_config(os.path.join(CONFIGS, "train", name))
    if name != "tiny_cpu.yaml":  # the original's (docs/algorithm.md section 3)
        assert (config.prompts_per_step, config.rollout.n) == (128, 16)
        assert config.learner.mini_batches == 16 and config.learner.ppo_epochs == 1
        assert (config.learner.lr, config.learner.warmup_steps) == (1e-6, 20)
        assert config.learner.lr_schedule == "constant"
        assert (config.learner.weight_decay, config.learner.max_grad_norm) == (0.01, 1.0)
        assert (config.learner.eps_low, config.learner.eps_high) == (0.2, 0.2)
        assert (config.learner.dual_clip, config.learner.kl_coef) == (3.0, 0.001)
        assert config.learner.entropy_coef == 0.0 and not config.learner.normalize_std
        assert (config.learner.loss_agg, config.learner.loss_agg_ranks) == (
            "per_rank_token_mean", 32)  # 4 nodes x 8 GPUs
        assert config.learner.remat != "none"  # full 8448-token rows need activation remat
        assert (config.rollout.temperature, config.rollout.top_p) == (1.0, 1.0)
        assert not config.dynamic_sampling.enabled and not config.data.shuffle
        v = config.validation
        assert (v.every, v.n, v.temperature, v.top_p) == (5, 4, 1.0, 0.7)
        assert (config.model.param_dtype, config.model.compute_dtype) == ("float32",
                                                                         "bfloat16")
        assert (config.memagent.chunk_tokens, config.memagent.max_memory_tokens,
                config.memagent.max_final_tokens, config.memagent.max_chunks) == (5000, 1024,
                                                                                   1024, 8)
    devices = DEVICES[name]
    axes = check_devices(config, devices)
    assert axes["data"] * axes["fsdp"] * axes["tensor"] == devices


def test_overrides_reach_nested_sections(config_file):
    config = load_train_config(config_file, ["learner.lr=3e-4", "steps=7", "learner.remat=full",
                                             "mesh={data: 2, fsdp: 4, tensor: 1}",
                                             "engine.prefill_buckets=[64, 128]"])
    assert config.learner.lr == 3e-4 and config.steps == 7 and config.learner.remat == "full"
    assert config.mesh == {"data": 2, "fsdp": 4, "tensor": 1}
    assert config.engine.prefill_buckets == (64, 128)
    assert config.checkpoint_dir.endswith(os.path.join("run", "checkpoints"))


def test_a_lora_section_round_trips_through_the_saved_config(config_file, tmp_path):
    """learner.lora reaches the learner's config, leaves the base in the compute dtype, and
    the run's config.yaml loads back to the same config (a resume's check)."""
    from memagent_jax.runconfig import differences, to_dict, write_config
    config = load_train_config(config_file, ["learner.lora.rank=4", "learner.lora.targets=[q, v]"])
    assert (config.learner.lora.rank, config.learner.lora.alpha) == (4, 16.0)
    assert config.learner.lora.targets == ("q", "v") and config.model.param_dtype is None
    write_config(config, str(tmp_path / "config.yaml"), "a run")
    again = load_train_config(str(tmp_path / "config.yaml"))
    assert again == config and not differences(to_dict(again), to_dict(config), ())
    other = load_train_config(config_file, ["learner.lora.rank=8", "learner.lora.targets=[q, v]"])
    assert differences(to_dict(other), to_dict(config), ())


SYNTHETIC = "plugin.module=memagent_jax.synthetic.plugin"  # the experiment's plugin

@pytest.mark.parametrize("overrides, message", [
    (["learner.lrr=1e-6"], "unknown key 'learner.lrr'"),
    (["data.reward=contains"], "unknown key 'data.reward': it is 'reward.function' now"),
    (["steps=many"], "key 'steps' must be int, got 'many'"),
    (["rollout.n=2.5"], "key 'rollout.n' must be int"),
    (["learner.remat=3"], "key 'learner.remat' must be one of 'none', 'matmuls', 'full', got 3"),
    (["learner.remat=true"], "key 'learner.remat' must be one of 'none', 'matmuls', 'full'"),
    (["data.train=[/nonexistent/train.parquet]"],
     "data.train[0]: '/nonexistent/train.parquet' not found"),
    (["data.train=[no_such_dir]"], "data.train[0]: 'no_such_dir' not found"),
    (["learner.micro_batch_rows=6"], "key 'learner.micro_batch_rows' was removed: "
                                     "micro-batches are sized by learner.micro_batch_tokens"),
    (["mesh={data: 4, fsdp: 2, tensor: 1}", "engine.slots=6"],
     "engine.slots: 6 decode slots do not split over mesh.data = 4"),
    (["mesh={data: 3, fsdp: 1, tensor: 1}"], "mesh: axis sizes"),
    (["learner.temperature=0.7"], "learner.temperature (0.7) must equal rollout.temperature"),
    (["validation.every=5", "data.val=null"], "data.val: validation is on"),
    (["model.path=/nonexistent/model"], "model: give exactly one of model.path"),
    (["learner.lr=-1"], "learner.lr: must be positive"),
    (["learner.lora.rank=0"], "learner.lora.rank: must be >= 1"),
    (["learner.lora={targets: [q, qkv]}"], "learner.lora.targets: must be distinct names"),
    (["model.lora=/nonexistent"], "model.lora: '/nonexistent' is not a PEFT adapter"),
    (["engine.prefill_rows=0"], "engine.prefill_rows: must be at least 1"),
    (["model.attention=flash"], "model.attention: must be one of"),
    (["learner.copy_rows=8"], "unknown key 'learner.copy_rows'"),
    (["overlong.enabled=true", "overlong.buffer=9"], "overlong.buffer: must be in 1..8 (the "
     "agent's smallest reply cap, memagent.max_memory_tokens), got 9"),
    (["learner.loss=sft"], "learner.loss: a supervised step trains on the trajectories a "
                           "plugin makes"),
    (["plugin.copy_rows=8"], "plugin.module: must name a module with build(settings, config)"),
    (["plugin.module=no_such_module_xyz"], "plugin.module: cannot import 'no_such_module_xyz'"),
    (["plugin.module=json"], "plugin.module: module 'json' has no build(settings, config)"),
    ([SYNTHETIC, "plugin.copy_rowz=8"], "unknown key 'plugin.copy_rowz'"),
    ([SYNTHETIC, "plugin.copy_rows=8"], "plugin.copy_rows: these rows are a supervised step's"),
    ([SYNTHETIC, "plugin.recall_rows=8"], "plugin.recall_rows: these rows are a supervised step's"),
    ([SYNTHETIC, "plugin.fact_rows=8"], "plugin.fact_rows: these rows are a supervised step's"),
    ([SYNTHETIC, "plugin.fact_rows=-1"], "plugin.fact_rows: must be at least 0"),
    ([SYNTHETIC, "plugin.carry_rows=8"], "plugin.carry_rows: these rows are a supervised step's"),
    ([SYNTHETIC, "plugin.carry_pool=0"], "plugin.carry_pool: must be at least 1"),
    ([SYNTHETIC, "plugin.carry_cut=true"], "plugin.carry_cut: cuts the carry rows' chunks"),
    ([SYNTHETIC, "plugin.carry_cut=sometimes"], "key 'plugin.carry_cut' must be bool"),
    ([SYNTHETIC, "plugin.copy_draw=normal"], "key 'plugin.copy_draw' must be one of"),
    ([SYNTHETIC, "plugin.target=oracles", "learner.loss=sft"],
     "key 'plugin.target' must be one of"),
    ([SYNTHETIC, "plugin.target=format"], "plugin.target: names what a supervised step trains on"),
    ([SYNTHETIC, "learner.loss=sft", "plugin.copy_span=4", "plugin.copy_span_min=5"],
     "plugin.copy_span_min: 5 is above copy_span 4"),
    ([SYNTHETIC, "plugin.carry_starts=9", "prompts_per_step=8"],
     "plugin.carry_starts: 9 is more than prompts_per_step 8"),
    (["prompts_per_step=1000000"], "prompts_per_step: 1000000 is more than the 8 rows of "
                                   "data.train ("),
    (["learner.learning_rate=1e-5"], "unknown key 'learner.learning_rate' (did you mean "
                                     "'learner.lr'?)"),
    ([SYNTHETIC, "plugin.carry_starts=1", "learner.loss=sft"],
     "plugin.carry_starts: carry starts are rollouts"),
    ([SYNTHETIC, "plugin.carry_starts=-1"], "plugin.carry_starts: must be at least 0"),
    ([SYNTHETIC, "plugin.start_chunks=0"], "plugin.start_chunks: must be at least 1"),
    ([SYNTHETIC, "plugin.carry_from=policy"], "plugin.carry_from: sets how carry starts begin"),
    ([SYNTHETIC, "plugin.start_task=twohop"], "plugin.start_task: sets how carry starts begin"),
    ([SYNTHETIC, "plugin.carry_starts=1", "plugin.carry_from=teacher"],
     "key 'plugin.carry_from' must be one of"),
])
def test_bad_input_is_one_line_before_any_device_work(config_file, overrides, message,
                                                      capsys, no_device_work):
    assert main(["train", "--config", config_file, *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith(PREFIX) and err.count("\n") == 1, err
    assert message in err, err


def test_missing_model_directory_and_tokenizer(config_file, capsys, no_device_work):
    assert main(["train", "--config", config_file, "model.preset=null",
                 "model.path=/nonexistent/model"]) == 2
    assert "model.path: '/nonexistent/model': model directory not found" in \
        capsys.readouterr().err
    assert main(["train", "--config", config_file, "model.tokenizer=/tmp"]) == 2
    assert "model.tokenizer: '/tmp' has no tokenizer files" in capsys.readouterr().err


@pytest.mark.parametrize("package", ["datasets", "grain", "tensorboard"])
def test_a_missing_package_is_one_line_before_any_device_work(config_file, package, monkeypatch,
                                                              capsys, no_device_work):
    block_package(monkeypatch, package)
    assert main(["train", "--config", config_file]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(PREFIX), err
    assert err[0].endswith(f"needs {package}, which is not installed: "
                           "pip install 'memagent-jax[train]'"), err


def test_a_missing_data_file_is_named_whether_datasets_is_installed_or_not(
        config_file, monkeypatch, capsys, no_device_work):
    block_package(monkeypatch, "datasets")
    assert main(["train", "--config", config_file, "data.train=[/nonexistent/train.parquet]"]) == 2
    assert capsys.readouterr().err == \
        PREFIX + "data.train[0]: '/nonexistent/train.parquet' not found\n"


def test_an_output_dir_that_is_a_file_is_one_line(config_file, capsys, no_device_work):
    assert main(["train", "--config", config_file, f"output_dir={config_file}"]) == 2
    assert capsys.readouterr().err == (f"{PREFIX}output_dir: {config_file} is a file, not a "
                                       "directory\n")


def test_the_command_exits_non_zero_without_touching_a_device(config_file):
    """A real process whose JAX backend cannot start: the config error still comes out as one
    line (exit 2), so nothing reached for a device first."""
    env = dict(os.environ, JAX_PLATFORMS="no_such_backend")
    run = subprocess.run([sys.executable, "-m", "memagent_jax.cli", "train", "--config",
                          config_file, "learner.lrr=1"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        PREFIX + "override 'learner.lrr=1': unknown key 'learner.lrr' (did you mean "
        "'learner.lr'?)"]


@pytest.mark.parametrize("key, value", [("micro_batch_rows", 8), ("credit", "amortise"),
                                        ("train_final_turn", False), ("seed", 3),
                                        ("train_final_turn", 1), ("seed", False)])
def test_a_removed_learner_key_loads_at_its_one_value_and_is_named_at_another(
        config_file, tmp_path, key, value):
    """An older run's saved config.yaml lists every key, the removed ones at the value that
    is now the only behaviour: it loads (the run resumes). Another value is one line saying
    what is left."""
    config = yaml.safe_load(open(config_file))
    old = tmp_path / "config.yaml"
    config["learner"].update(micro_batch_rows=None, credit="broadcast", train_final_turn=True,
                             seed=0)
    old.write_text(yaml.safe_dump(config))
    assert load_train_config(str(old)) == load_train_config(config_file)
    config["learner"][key] = value
    old.write_text(yaml.safe_dump(config))
    with pytest.raises(UserError, match=f"^{old}: key 'learner.{key}' was removed: .*; "
                                        "delete it$"):
        load_train_config(str(old))


def test_loading_a_train_config_imports_no_jax_agent_plugin_or_runner():
    """A train config is plain data: loading the shipped ones (MemAgent's with the synthetic
    plugin, the tool agent's with the lookup plugin) in a fresh process imports no JAX, model,
    runner, agent or plugin module; the trainer builds those (rl/build.py)."""
    heavy = ("jax", "flax", "memagent_jax.models.qwen", "memagent_jax.engine.engine",
             "memagent_jax.engine.scheduler", "memagent_jax.rollout.runner",
             "memagent_jax.agents.memagent.agent", "memagent_jax.agents.tool_calling",
             "memagent_jax.rl.plugin", "memagent_jax.synthetic", "memagent_jax.lookup")
    configs = [os.path.join(CONFIGS, *name) for name in (
        ("synthetic", "08_dapo.yaml"), ("lookup", "00_format.yaml"), ("train", "tiny_cpu.yaml"))]
    code = """if True:
        import json, sys
        from memagent_jax.rl.config import load_train_config
        for path in sys.argv[2:]:
            load_train_config(path)
        print(json.dumps([h for h in json.loads(sys.argv[1]) if any(
            m == h or m.startswith(h + ".") for m in sys.modules)]))"""
    run = subprocess.run([sys.executable, "-c", code, json.dumps(heavy), *configs],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == []


def test_device_checks():
    config = load_train_config(None, ["model.preset=tiny", "model.tokenizer=x",
                                      "data.train=[x]", "prompts_per_step=6"])
    assert check_devices(config, 8) == {"data": 1, "fsdp": 8, "tensor": 1}
    config.mesh = {"data": 2, "fsdp": -1, "tensor": 2}
    assert check_devices(config, 8) == {"data": 2, "fsdp": 2, "tensor": 2}
    with pytest.raises(UserError, match="6 devices do not divide by 4"):
        check_devices(config, 6)
    config.mesh = {"data": -1, "fsdp": -1}
    with pytest.raises(UserError, match="only one axis may be -1"):
        check_devices(config, 8)
    config.mesh = {"pipeline": 2}
    with pytest.raises(UserError, match="unknown mesh axis 'pipeline'"):
        check_devices(config, 8)


def test_validate_rejects_inconsistent_sections():
    config = load_train_config(None, ["model.preset=tiny", "model.tokenizer=x", "data.train=[x]"])
    config.overlong.enabled, config.overlong.buffer = True, 5000
    check(config)  # the agent's reply caps are checked where it is built
    with pytest.raises(UserError, match=r"overlong.buffer: must be in 1..1024"):
        build_run(config)
    config.overlong.enabled = False
    config.rollout.top_p = 0.0
    with pytest.raises(UserError, match=r"rollout.top_p: must be in \(0, 1\]"):
        check(config)
    with pytest.raises(UserError, match="data.train: no training source"):
        load_train_config(None, ["model.preset=tiny", "model.tokenizer=x"])
    with pytest.raises(UserError, match="model.tokenizer: a preset model needs"):
        load_train_config(None, ["model.preset=tiny", "data.train=[x]"])


# The runs the stop tests compare: 4 steps, shuffled data, a checkpoint only at the end (so a
# stop's checkpoint is there because of the stop).
_FOUR_STEPS = ["steps=4", "data.shuffle=true", "checkpoint.every=0"]


# The CLI sending itself SIGINT, what Ctrl-C sends, where CTRL_C_AT says: "rollouts N" after
# step N's first turn, "boundary N" once step N has returned (before the run looks for a stop);
# and again while the stop's checkpoint commits.
_CTRL_C = """
import os, signal, sys, time
from memagent_jax.distributed.preemption import PreemptionNotice
from memagent_jax.cli import main
from memagent_jax.rl.checkpointing import Checkpointer
from memagent_jax.rl.trainer import Trainer

where, at = os.environ["CTRL_C_AT"].split()
running = [0]
train_step, reached = Trainer.train_step, PreemptionNotice.reached
wait = Checkpointer.wait

def ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)  # the handler runs

def pressing_train_step(self, step):
    running[0] = step
    record = train_step(self, step)
    if where == "boundary" and step == int(at):
        ctrl_c()
    return record

def pressing_reached(self):
    if where == "rollouts" and running[0] == int(at) and not getattr(self, "pressed", False):
        self.pressed = True
        ctrl_c()
    return reached(self)

def pressing_wait(self):
    if not getattr(self, "pressed", False):  # while the stop's checkpoint commits (not at close)
        self.pressed = True
        ctrl_c()
    wait(self)

Trainer.train_step = pressing_train_step
PreemptionNotice.reached = pressing_reached
Checkpointer.wait = pressing_wait
sys.exit(main(sys.argv[1:]))
"""


def _train_process(config_file, output_dir, ctrl_c_at: str | None = None) -> subprocess.Popen:
    """`memagent-jax train` of the four steps in a fresh process on one CPU device; with
    ctrl_c_at, Ctrl-C there (_CTRL_C)."""
    env = multiprocess.environment(devices=1)
    cli = ["-m", "memagent_jax.cli"]
    if ctrl_c_at:
        env["CTRL_C_AT"], cli = ctrl_c_at, ["-c", _CTRL_C]
    return subprocess.Popen([sys.executable, *cli, "train", "--config", config_file,
                             *_FOUR_STEPS, f"output_dir={output_dir}"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _examples(output_dir) -> list[list[int]]:
    """Each logged step's drawn example indices, in order."""
    with open(os.path.join(output_dir, "logs", "steps.jsonl")) as f:
        return [json.loads(line)["examples"] for line in f if json.loads(line)["step"]]


def _checkpoints(output_dir) -> list[int]:
    return sorted(int(p) for p in os.listdir(Path(output_dir) / "checkpoints") if p.isdigit())


@pytest.fixture(scope="module")
def uninterrupted(config_file, tmp_path_factory) -> list[list[int]]:
    """The examples each step of the four steps draws when nothing stops the run."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    _, err = (run := _train_process(config_file, out)).communicate(timeout=300)
    assert run.returncode == 0, err[-3000:]
    return _examples(out)


def test_a_stop_notice_takes_either_signal_and_a_second_changes_nothing(capfd):
    """SIGINT and SIGTERM only set the notice's flag while it listens (Ctrl-C says so on
    stderr, each time); SIGINT is what the job stops for once any process got one; the
    handlers found are given back."""
    from memagent_jax.distributed.preemption import PreemptionNotice

    def not_the_notice(signum, frame):
        raise AssertionError(f"signal {signum} reached the handler the notice replaces")

    found = {s: signal.signal(s, not_the_notice) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with PreemptionNotice(on_interrupt="stopping soon") as notice:
            assert not notice.reached() and not notice.interrupted
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            assert notice.reached() and notice.interrupted
        assert capfd.readouterr().err == "\nstopping soon\n" * 2
        assert signal.getsignal(signal.SIGINT) is signal.getsignal(signal.SIGTERM) is (
            not_the_notice)
        with PreemptionNotice() as notice:
            os.kill(os.getpid(), signal.SIGTERM)
            assert notice.reached() and not notice.interrupted
    finally:
        for s, handler in found.items():
            signal.signal(s, handler)


def test_a_sigterm_after_a_sigint_still_stops_for_the_ctrl_c(capfd):
    """Ctrl-C outranks a preemption notice whatever their order: SIGINT then SIGTERM stops the
    job as interrupted (what makes `train` exit 130), not as preempted (exit 143)."""
    from memagent_jax.distributed.preemption import PreemptionNotice

    with PreemptionNotice(on_interrupt="stopping soon") as notice:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        assert notice.reached() and notice.interrupted
    assert capfd.readouterr().err == "\nstopping soon\n"


@pytest.mark.slow
def test_ctrl_c_keeps_the_last_printed_step_and_the_reruns_draw_what_an_uninterrupted_run_does(
        config_file, uninterrupted, tmp_path):
    """Ctrl-C in step 3's rollouts abandons step 3; Ctrl-C once step 3 of the rerun has
    returned lets it stand. Either way the last step whose line was printed is checkpointed
    (though checkpoint.every=0) with its data position, a second Ctrl-C while that checkpoint
    commits changes nothing, one line says which step is kept and how to resume, exit 130;
    the same command resumes from it and the run draws the examples of one never stopped."""
    out = tmp_path / "run"
    for ctrl_c_at, kept in (("rollouts 3", 2), ("boundary 3", 3)):
        _, err = (run := _train_process(config_file, out, ctrl_c_at)).communicate(timeout=300)
        assert run.returncode == 130, err[-3000:]
        assert "Traceback" not in err
        assert err.count("Ctrl-C: stopping at the next turn or step boundary") == 2
        assert [int(n) for n in re.findall(r"^step (\d)/4:", err, re.MULTILINE)][-1] == kept
        assert err.strip().splitlines()[-1] == (
            f"memagent-jax: interrupted (Ctrl-C) after step {kept}: step {kept} is "
            f"checkpointed in {out / 'checkpoints'}; run the same command to resume")
        assert _checkpoints(out)[-1] == kept

    _, err = (run := _train_process(config_file, out)).communicate(timeout=300)
    assert run.returncode == 0, err[-3000:]
    assert f"resuming from step 3 ({out / 'checkpoints'}/3)" in err
    assert "finished step 4 of 4" in err.strip().splitlines()[-1]
    assert _examples(out) == uninterrupted


@pytest.mark.slow
def test_sigterm_mid_step_checkpoints_the_previous_step_and_the_rerun_draws_the_same(
        config_file, uninterrupted, tmp_path, capsys, monkeypatch):
    """SIGTERM (a preemption notice) at the start of step 2's rollouts: step 1 is checkpointed
    (though checkpoint.every=0) with the data position step 2 started from, the command
    exits 143 (128 + SIGTERM: a scheduler requeues it, never taking it for a finished run)
    with one line, and SIGTERM's handler is given back; the same command resumes and draws
    the examples of a run never stopped."""
    out = tmp_path / "run"
    args = ["train", "--config", config_file, *_FOUR_STEPS, f"output_dir={out}"]
    step = Trainer.train_step

    def signal_in_step_2(self, number):
        if number == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return step(self, number)

    monkeypatch.setattr(Trainer, "train_step", signal_in_step_2)
    handler = signal.getsignal(signal.SIGTERM)
    assert main(args) == 143
    assert signal.getsignal(signal.SIGTERM) is handler
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"memagent-jax: stopped by a preemption notice (SIGTERM) after step 1: step 1 is "
        f"checkpointed in {out / 'checkpoints'}; run the same command to resume")
    assert _checkpoints(out) == [1]

    monkeypatch.setattr(Trainer, "train_step", step)
    assert main(args) == 0
    assert f"resuming from step 1 ({out / 'checkpoints'}/1)" in capsys.readouterr().err
    assert _examples(out) == uninterrupted


def test_a_section_given_in_part_keeps_the_training_defaults():
    """Training reads 8 chunks at most with 64 slots unless told otherwise, also when other keys
    of those sections are set (the sections' own classes default to all chunks and 8 slots)."""
    config = load_train_config(None, ["model.preset=tiny", "model.tokenizer=x", "data.train=[x]",
                                      "memagent.chunk_tokens=4000", "engine.prefill_rows=2"])
    assert (config.memagent.chunk_tokens, config.memagent.max_chunks) == (4000, 8)
    assert (config.engine.slots, config.engine.prefill_rows) == (64, 2)


def test_training_defaults_are_the_published_scripts():
    """What a config that says nothing gets: the published run's choices (docs/algorithm.md
    section 7 lists the few that are not)."""
    config = load_train_config(None, ["model.preset=tiny", "model.tokenizer=x", "data.train=[x]"])
    assert not config.dynamic_sampling.enabled and not config.data.shuffle
    v = config.validation
    assert (v.n, v.temperature, v.top_p) == (4, 1.0, 0.7)
    assert config.model.param_dtype == "float32"
    assert (config.learner.eps_high, config.learner.kl_coef) == (0.2, 0.001)


def test_a_bad_plugin_key_in_a_file_names_the_file(config_file, tmp_path, capsys,
                                                   no_device_work):
    path = tmp_path / "step.yaml"
    path.write_text(yaml.safe_dump({"base": config_file, "plugin": {
        "module": "memagent_jax.synthetic.plugin", "carry_startz": 1}}))
    assert main(["train", "--config", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"{PREFIX}{path} (over {config_file}): unknown key 'plugin.carry_startz' (did you mean "
        "'plugin.carry_starts' or 'plugin.carry_cut' or 'plugin.carry_rows'?)\n")
