"""The RL trainer end to end on the synthetic needle task (data/needle.py): the memory loop,
logs, TensorBoard, checkpoints, exact resume after SIGKILL, the processes' per-step lockstep
check, and skipped NaN updates."""

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import yaml

from memagent_jax.data.needle import write_task
from memagent_jax.data.pipeline import Example
from memagent_jax.distributed import collectives
from memagent_jax.rl import steps as steps_module
from memagent_jax.rl.collect import RolloutBatch
from memagent_jax.rl.config import load_train_config
from memagent_jax.rl.trainer import Trainer, no_update_line
from tests import multiprocess
from tests.full_disk import fail_orbax_writes

pytestmark = pytest.mark.slow  # training runs

EXPECTED_TAGS = {
    "reward/mean", "reward/std", "val/accuracy", "val/f1", "learner/kl", "learner/entropy",
    "learner/clip_fraction", "learner/grad_norm", "learner/lr", "learner/skipped_updates",
    "rollout/response_length", "rollout/memory_length", "rollout/turns",
    "dynamic/kept_fraction", "time/rollout_s", "time/update_s", "rollout/tokens_per_s",
    "learner/tokens_per_s"}


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """The needle task (32 training rows, 4 validation rows, its tokenizer)."""
    root = tmp_path_factory.mktemp("needle")
    return write_task(str(root / "task"), train_size=32, val_size=4, seed=3)


def _write_config(task, path, **top) -> str:
    """A YAML config for a tiny run: 4 prompts x n=4, documents of 2-3 chunks of 32 tokens."""
    config = {
        "model": {"preset": "tiny", "tokenizer": task["tokenizer"], "compute_dtype": "float32"},
        "mesh": {"data": 1, "fsdp": -1, "tensor": 1},
        "data": {"train": [task["train"]], "val": task["val"]}, "reward": {"function": "contains"},
        "memagent": {"chunk_tokens": 32, "max_memory_tokens": 12, "max_final_tokens": 8,
                     "max_problem_tokens": 8},
        "engine": {"slots": 16, "prefill_buckets": [256]},
        "rollout": {"n": 4},
        "dynamic_sampling": {"enabled": True, "max_tries": 2},
        "learner": {"lr": 1e-3, "warmup_steps": 0, "micro_batch_tokens": 8192,
                    "bucket_lengths": [256]},
        "validation": {"every": 2, "size": 4, "n": 2},
        "checkpoint": {"every": 2, "keep": 3},
        "steps": 3, "prompts_per_step": 4, "seed": 5,
        # The session's cache (conftest), given as the config key: every run shares it.
        "compilation_cache_dir": os.environ["JAX_COMPILATION_CACHE_DIR"],
    }
    for key, value in top.items():
        node = config
        *parents, name = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[name] = value
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return str(path)


def _records(output_dir) -> list[dict]:
    with open(os.path.join(output_dir, "logs", "steps.jsonl")) as f:
        return [json.loads(line) for line in f]


def _saved_state(checkpoint_dir, step) -> dict:
    """A checkpoint's {params, opt_state, step} as read back by Orbax (no target)."""
    return jax.device_get(ocp.StandardCheckpointer().restore(
        os.path.join(checkpoint_dir, str(step), "state")))


def _assert_trees_equal(a, b):
    """Same leaves at the same paths (a target-less Orbax restore gives the layer indices as
    string keys, so paths are compared as text)."""
    def by_path(tree):
        return {"/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): leaf
                for path, leaf in jax.tree.leaves_with_path(tree)}

    leaves_a, leaves_b = by_path(a), by_path(b)
    assert leaves_a.keys() == leaves_b.keys()
    for path, x in leaves_a.items():
        np.testing.assert_array_equal(np.asarray(x), np.asarray(leaves_b[path]), err_msg=path)


class _Run:
    """A finished 3-step run: its trainer, output dir, initial parameters, last step's record,
    and, per decode step, whether the engine got the learner's own arrays."""


@pytest.fixture(scope="module")
def three_steps(task, tmp_path_factory) -> _Run:
    """3 steps on 8 simulated devices (data 2 x fsdp 2 x tensor 2), checkpoints at 2 and 3,
    2 rollouts a step in logs/rollouts.jsonl; the rows each update trained."""
    run, root = _Run(), tmp_path_factory.mktemp("three_steps")
    run.out = root / "run"
    # Final replies of 48 tokens: the untrained model then says the 1-in-512 code word in about
    # one trajectory in ten, so some group of the 24 drawn has mixed rewards (none does with
    # probability ~1e-4; with 8 tokens, ~1 in 5 random streams kept nothing to train on).
    config = load_train_config(_write_config(task, root / "c.yaml",
                                             memagent__max_final_tokens=48), [
        f"output_dir={run.out}", "mesh={data: 2, fsdp: 2, tensor: 2}",
        "log.rollouts_every=1", "log.rollouts=2"])
    run.trainer = trainer = Trainer(config)
    run.initial = jax.device_get(trainer.learner.state()["params"])
    engine, learner = trainer.runner.scheduler.engine, trainer.learner
    run.decoded_with_learners_arrays = []
    step = engine.generate

    def generate(params, state, length, filled=None):
        # The engine's copy (weights over tensor only) of the learner's current parameters
        # (over fsdp x tensor): the layouts differ, the values do not.
        placed, current = params["embed"], learner.params["embed"]
        run.decoded_with_learners_arrays.append(
            placed.sharding.spec != current.sharding.spec
            and np.array_equal(np.asarray(placed), np.asarray(current)))
        return step(params, state, length, filled)

    engine.generate = generate
    run.trained_rows, update = [], learner.update

    def update_recorded(rows):
        run.trained_rows.append(rows)
        return update(rows)

    learner.update = update_recorded
    run.last = trainer.run()
    return run


@pytest.mark.slow
def test_trains_through_the_memory_loop_with_logs_tensorboard_and_checkpoints(three_steps):
    """Every trajectory runs the multi-conversation loop, the engine decodes with its copy of
    the learner's current parameters, logs and TensorBoard carry every scalar, checkpoints 2 and 3
    hold the parameters
    of those steps."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, trainer, initial, last = (three_steps.out, three_steps.trainer, three_steps.initial,
                                   three_steps.last)
    decoded_with_learners_arrays = three_steps.decoded_with_learners_arrays
    records = _records(out)
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        # Documents of 25-70 words in chunks of 32 tokens: 2-4 conversations per trajectory.
        assert 2 <= r["rollout/turns"] <= 4
        assert r["rollout/memory_length"] > 0 and r["rollout/final_length"] > 0
        assert 0 < r["dynamic/kept_fraction"] <= 1 or r["learner/updates"] == 0
        assert len(r["examples"]) >= 4 and set(r["kept"]) <= set(r["examples"])
    assert "val/accuracy" in records[1] and "val/accuracy" not in records[0]
    assert last["step"] == 3
    updated = [r for r in records if r["learner/updates"] > 0]
    assert updated, "no step kept an informative group"
    assert all(np.isfinite(r["learner/loss"]) and r["learner/tokens"] > 0 for r in updated)

    # The engine decodes with its copy of the learner's current parameters, in its layout.
    assert decoded_with_learners_arrays and all(decoded_with_learners_arrays)
    final = jax.device_get(trainer.learner.state()["params"])
    assert any(not np.array_equal(a, b) for a, b in
               zip(jax.tree.leaves(initial), jax.tree.leaves(final)))

    checkpoints = out / "checkpoints"
    assert sorted(int(p) for p in os.listdir(checkpoints) if p.isdigit()) == [2, 3]
    saved = _saved_state(str(checkpoints), 3)
    _assert_trees_equal(saved["params"], final)

    events = EventAccumulator(str(out / "logs" / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert tags >= EXPECTED_TAGS, EXPECTED_TAGS - tags
    assert [e.step for e in events.Scalars("reward/mean")] == [1, 2, 3]
    assert [e.step for e in events.Scalars("val/accuracy")] == [2]
    assert events.Scalars("reward/mean")[0].value == pytest.approx(records[0]["reward/mean"])
    # The engine and the learner compute in float32: the learner's log-probs of the sampled
    # tokens are the engine's up to rounding (its blocked forward against the cached decode).
    # Seen: mean |delta log p| 1.6e-7 and k3 4e-14; a bf16 run's are 5e-4 and 2e-7
    # (tests/rl/test_precision.py).
    for tag, most in (("learner/rollout_logprob_abs_diff", 1e-5),
                      ("learner/rollout_kl_k3", 1e-10)):
        assert [e.step for e in events.Scalars(tag)] == [r["step"] for r in updated]
        assert all(0 <= e.value < most for e in events.Scalars(tag)), tag


@pytest.mark.slow
def test_rollouts_jsonl_holds_the_first_rollouts_of_each_step_as_trained(three_steps):
    """Each updating step's 2 first trajectories, their conversations the rows the update
    trained: ids, loss mask and behaviour log-probs."""
    with open(three_steps.out / "logs" / "rollouts.jsonl") as f:
        lines = [json.loads(line) for line in f]
    updated = [r["step"] for r in _records(three_steps.out) if r["learner/updates"] > 0]
    assert [(r["step"], r["sample"]) for r in lines] == [(s, j) for s in updated
                                                          for j in (0, 1)]
    for k, rows in enumerate(three_steps.trained_rows):
        for i, record in enumerate(lines[2 * k:2 * k + 2]):
            mine = np.flatnonzero(rows.trajectory == i)
            assert len(record["conversations"]) == len(mine) >= 2  # the memory loop's turns
            assert record["conversations"][-1]["kind"] == "final"
            for conversation, r in zip(record["conversations"], mine):
                n = rows.lengths[r]
                assert conversation["ids"] == rows.tokens[r, :n].tolist()
                assert conversation["loss_mask"] == rows.loss_mask[r, :n].tolist()
                assert conversation["logprobs"] == rows.rollout_logprobs[r, :n].tolist()
            assert record["reward"] in (0.0, 1.0) and record["advantage"] == rows.advantages[
                mine[0]]


@pytest.mark.slow
def test_a_steps_rollout_on_the_mesh_equals_one_devices(task, tmp_path):
    """A DAPO step's rollout (`collect_batch`: n trajectories a prompt through the memory loop
    at temperature 1, every group kept) on data 2 x fsdp 2 x tensor 2, 16 trajectories on 8
    slots, prompts prefilled 4 a call in the engine's own layout, and on one device from the
    same weights, one a call: the same tokens, log-probs within 1e-3, the same rewards."""
    from memagent_jax.agents.memagent.agent import MemAgent
    from memagent_jax.data import pipeline
    from memagent_jax.engine.factory import load_model_section
    from memagent_jax.rl.collect import collect_batch
    from memagent_jax.rollout.runner import build_runner

    config = load_train_config(_write_config(task, tmp_path / "c.yaml"), [
        f"output_dir={tmp_path / 'run'}", "mesh={data: 2, fsdp: 2, tensor: 2}",
        "engine.slots=8", "engine.prefill_rows=4", "dynamic_sampling.enabled=false"])
    trainer = Trainer(config)
    loaded = load_model_section(config.model, trainer.tokenizer, None)
    # x 10: context-dependent distributions (tests/engine/test_rollout_layout.py, _sharp)
    sharp = jax.tree.map(lambda x: 10 * x, trainer.learner.params)
    params = jax.device_put(jax.device_get(sharp), jax.devices()[0])
    alone = build_runner(MemAgent(config.memagent), loaded.model, trainer.tokenizer,
                         dataclasses.replace(config.engine, prefill_rows=1), None,
                         loaded.stop_ids)
    batches = [collect_batch(runner, trainer.agent, weights, pipeline.training_iterator(
        trainer.train_data, config.seed, shuffle=config.data.shuffle), config,
        trainer.rewarder, lambda k: 11 + k)
        for runner, weights in ((trainer.runner, sharp), (alone, params))]
    turns = [[t for group in b.groups for trajectory in group for t in trajectory.turns]
             for b in batches]
    assert [t.response_ids for t in turns[0]] == [t.response_ids for t in turns[1]]
    for a, b in zip(*turns):
        np.testing.assert_allclose(a.response_logprobs, b.response_logprobs, atol=1e-3)
    np.testing.assert_array_equal(batches[0].rewards, batches[1].rewards)
    assert len(turns[0]) >= 2 * config.prompts_per_step * config.rollout.n


@pytest.mark.slow
def test_a_training_checkpoint_is_a_model_everywhere(three_steps, tmp_path):
    """A step directory (or the run's directory: its newest step) exports to an HF directory
    that transformers loads with AutoTokenizer and AutoModelForCausalLM, its logits those of
    the trainer's parameters and its greedy generation `generate`'s; `run` and `eval` read it
    directly."""
    import torch
    from flax import nnx
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memagent_jax.cli import main
    from memagent_jax.eval.config import EvalConfig
    from memagent_jax.eval.runner import run_eval
    from memagent_jax.model_dir import training_step_dir
    from memagent_jax.runconfig import load_config
    from memagent_jax.tokenizer import load_tokenizer

    step = three_steps.out / "checkpoints" / "3"
    assert training_step_dir(str(three_steps.out)) == str(step)
    exported = tmp_path / "hf"
    assert main(["export", "--model", str(three_steps.out), "--out", str(exported)]) == 0
    hf = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    # The ecosystem's default: transformers picks Qwen2's tokenizer class from config.json and
    # rebuilds it from tokenizer.json; it reads our ids (data/word_tokenizer.py).
    tokenizer = AutoTokenizer.from_pretrained(exported)
    text = "the secret code is"
    assert (tokenizer(text, add_special_tokens=False)["input_ids"]
            == load_tokenizer(str(step))(text, add_special_tokens=False)["input_ids"]
            == [load_tokenizer(str(step)).convert_tokens_to_ids("Ġ" + w) for w in text.split()])
    ids = np.array([tokenizer(text, add_special_tokens=False)["input_ids"]
                    + list(range(10, 30))])
    learner = three_steps.trainer.learner
    ours = np.asarray(nnx.merge(learner.graphdef, learner.params)(ids))
    with torch.no_grad():
        theirs = hf(torch.as_tensor(ids)).logits.numpy()
    assert np.abs(ours - theirs).max() <= 1e-5
    # Greedy generation through AutoTokenizer and transformers equals `generate`'s.
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "what is the secret "
                                             "code ?"}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False)
    expected = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                           eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id)[0, len(prompt):].tolist()
    requests, completions = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    requests.write_text(json.dumps({"prompt_ids": prompt}) + "\n")
    assert main(["generate", "--model", str(exported), "--input", str(requests), "--out",
                 str(completions), "--max-new-tokens", "12", "--temperature", "0"]) == 0
    completion = json.loads(completions.read_text())
    assert completion["completion_ids"] == expected
    assert completion["text"] == tokenizer.decode(expected, skip_special_tokens=True)

    document = tmp_path / "doc.txt"
    document.write_text("the secret code is apple . " * 20)
    assert main(["run", "--model", str(step), "--doc", str(document), "--question",
                 "what is the secret code ?", "--chunk-tokens", "32", "--max-memory-tokens",
                 "4", "--max-final-tokens", "4", "--temperature", "0"]) == 0
    eval_set = tmp_path / "needle.json"
    eval_set.write_text(json.dumps([{"context": "the secret code is apple . " * 10,
                                     "input": "what is the secret code ?",
                                     "answers": ["apple"]}]))
    config = load_config(EvalConfig, None, [
        f"model.path={step}", f"data.sets=[{eval_set}]", f"output_dir={tmp_path / 'eval'}",
        "memagent.chunk_tokens=32", "memagent.max_memory_tokens=4",
        "memagent.max_final_tokens=4", "memagent.max_problem_tokens=16", "engine.slots=2"])
    summary = run_eval(config)
    assert summary["columns"][0]["samples"] == 1


@pytest.mark.slow
def test_a_full_disk_stops_the_run_in_one_line_and_the_rerun_is_the_uninterrupted_run(
        three_steps, task, tmp_path, monkeypatch, capsys):
    """`three_steps`' run with its step-3 checkpoint failing as on a full disk
    (tests/full_disk.py; found when the run closes, as an async save fails in Orbax's
    thread): one line naming the checkpoint directory and the step kept, step 3's partial
    directory removed, step 2 as it was, announced as kept and step 3 never; rerun with space
    again, it resumes from step 2 and ends where the uninterrupted run ended, parameters and
    optimiser state equal. The validation before training (`validation.at_start`, which
    changes no step) is printed, not only logged."""
    from memagent_jax.cli import main

    out = tmp_path / "run"
    argv = ["train", "--config", _write_config(task, tmp_path / "c.yaml",
                                               memagent__max_final_tokens=48),
            f"output_dir={out}", "mesh={data: 2, fsdp: 2, tensor: 2}",
            "validation.at_start=true"]
    checkpoints = out / "checkpoints"
    with monkeypatch.context() as patched:
        failed = fail_orbax_writes(patched, lambda where: "3.orbax-checkpoint-tmp" in where)
        assert main(argv) == 2
    assert failed
    err = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()
    assert err[-1] == (f"memagent-jax: error: no space left on device writing {checkpoints}; "
                       "the newest checkpoint is step 2; free some space and run the same "
                       "command to resume")
    assert "Traceback" not in "\n".join(err)
    assert [line for line in err if re.match(r"step \d+: checkpoint", line)] == [
        f"step 2: checkpoint kept in {checkpoints}/2"]
    (before,) = [line for line in err if line.startswith("step 0/3 (before training): val ")]
    assert f"val {_records(out)[0]['val/accuracy']:.1f}, " in before
    assert sorted(os.listdir(checkpoints)) == ["2", "model"]
    _assert_trees_equal(_saved_state(str(checkpoints), 2),
                        _saved_state(str(three_steps.out / "checkpoints"), 2))

    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "resuming from step 2" in err and f"step 3: checkpoint kept in {checkpoints}/3" in err
    _assert_trees_equal(_saved_state(str(checkpoints), 3),
                        _saved_state(str(three_steps.out / "checkpoints"), 3))
    first, second = _records(three_steps.out), _records(out)[1:]  # after step 0's validation
    assert [r["step"] for r in second] == [1, 2, 3]
    assert [r["examples"] for r in first] == [r["examples"] for r in second]
    assert [r["reward/mean"] for r in first] == [r["reward/mean"] for r in second]


def _cli(config_path, output_dir, *overrides):
    """`memagent-jax train` in a fresh process on one CPU device."""
    env = multiprocess.environment(devices=1)
    return subprocess.Popen(
        [sys.executable, "-m", "memagent_jax.cli", "train", "--config", config_path,
         f"output_dir={output_dir}", *overrides],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


LORA = "learner.lora={rank: 2, alpha: 4}"


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_resume_after_sigkill_repeats_the_uninterrupted_run_exactly(task, tmp_path, lora):
    """4 steps straight vs 2 steps, SIGKILL right after step 2's checkpoint commits, resume
    for 2 more: identical parameters (under LoRA: adapters), optimiser state and data order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = _write_config(task, tmp_path / "c.yaml", steps=4, validation__every=0)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    extra = [LORA] if lora else []
    run = _cli(config, straight, *extra)
    _, err = run.communicate(timeout=300)
    assert run.returncode == 0, err[-2000:]

    run = _cli(config, killed, *extra)
    committed = killed / "checkpoints" / "2"  # Orbax renames the step in only once complete
    deadline = time.monotonic() + 300
    while not committed.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    run.send_signal(signal.SIGKILL)
    _, err = run.communicate(timeout=60)
    assert run.returncode == -signal.SIGKILL, f"the run ended before the kill: {err[-2000:]}"
    steps_on_disk = sorted(int(p) for p in os.listdir(killed / "checkpoints") if p.isdigit())
    assert steps_on_disk == [2], steps_on_disk

    run = _cli(config, killed, *extra)
    _, err = run.communicate(timeout=300)
    assert run.returncode == 0, err[-2000:]
    assert "step 3/4" in err and "step 1/4" not in err  # it resumed, it did not start over

    a = _saved_state(str(straight / "checkpoints"), 4)
    b = _saved_state(str(killed / "checkpoints"), 4)
    _assert_trees_equal(a, b)
    if lora:  # adapters only, trained (B starts at zero)
        assert set(a["params"]) == {"layers"}
        assert np.abs(a["params"]["layers"]["0"]["mlp"]["down_kernel"]["b"]).max() > 0
    first, second = _records(straight), _records(killed)
    assert [r["step"] for r in second] == [1, 2, 3, 4]
    assert [r["examples"] for r in first] == [r["examples"] for r in second]
    assert [r["kept"] for r in first] == [r["kept"] for r in second]
    assert [r["reward/mean"] for r in first] == [r["reward/mean"] for r in second]

    # TensorBoard shows each step once: events the killed run wrote past step 2 are dropped.
    events = EventAccumulator(str(killed / "logs" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("reward/mean")] == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_lora_run_resumes_only_on_its_base(task, tmp_path, monkeypatch):
    """The same model.path with other weights: the resume is refused in one line naming
    both fingerprints; nothing is trained. The base is named relative to where the run
    started and the run is exported from another directory."""
    from memagent_jax.cli import main
    from memagent_jax.errors import UserError
    from memagent_jax.models.loading import load_model, random_model, save_hf
    from memagent_jax.models.presets import preset_config
    from memagent_jax.models.qwen import split_params

    base = str(tmp_path / "base")
    tiny = preset_config("tiny", dtype="float32")
    save_hf(random_model(tiny, seed=0), tiny, base)
    monkeypatch.chdir(tmp_path)
    config = load_train_config(_write_config(
        task, tmp_path / "c.yaml", steps=3, validation__every=0, memagent__max_final_tokens=48,
        model={"path": "base", "tokenizer": task["tokenizer"], "compute_dtype": "float32"}),
        [f"output_dir={tmp_path / 'run'}", LORA])
    Trainer(config).run()
    first = Trainer(config)  # the same base: resumes (nothing left to do)
    assert first.step == 3 and sum(r["learner/updates"] for r in _records(tmp_path / "run"))
    trained = jax.device_get(first.learner.params)
    first.close()

    # The run's checkpoint is a model (base + adapters), and exports as a PEFT adapter that
    # loads on the base to the same weights.
    run_dir, adapter = str(tmp_path / "run"), str(tmp_path / "adapter")
    merged = str(tmp_path / "merged")
    monkeypatch.chdir(tmp_path / "run")
    assert main(["export", "--model", run_dir, "--out", adapter]) == 0
    assert os.path.isfile(os.path.join(adapter, "adapter_model.safetensors"))
    assert main(["export", "--model", run_dir, "--merged", "--out", merged]) == 0
    for model in (load_model(run_dir)[0], load_model(base, lora=adapter)[0],
                  load_model(merged)[0]):
        for a, b in zip(jax.tree.leaves(jax.device_get(split_params(model)[1])),
                        jax.tree.leaves(trained)):
            np.testing.assert_allclose(a, b, atol=1e-6)
    untrained = jax.device_get(split_params(random_model(tiny, seed=0))[1])
    assert not np.array_equal(trained["layers"][0]["mlp"]["up_kernel"],
                              untrained["layers"][0]["mlp"]["up_kernel"])

    shutil.rmtree(base)
    save_hf(random_model(tiny, seed=1), tiny, base)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"checkpoints/3: holds LoRA adapters trained on "
                                        r".*base \(weights [0-9a-f]{16}\); this run is LoRA on "
                                        r".*\(weights [0-9a-f]{16}\)") as e:
        Trainer(config)
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="its LoRA adapters were trained on .* with weights "
                                        "[0-9a-f]{16}, and those weights are now"):
        load_model(run_dir)


def test_the_lockstep_check_stops_a_process_that_drew_sampled_or_kept_differently(
        task, tmp_path, monkeypatch):
    """Each step the processes compare the examples they drew, the seeds they sampled with
    and the examples they kept: a process that differs from process 0 in any one of them
    stops the job. Here step 1 runs first as process 0 would (its comparison's other side),
    then as a process 1 that differs; collect_batch gives canned batches (no rollouts)."""
    config = load_train_config(_write_config(task, tmp_path / "c.yaml"), [
        f"output_dir={tmp_path / 'run'}", "validation.every=0", "checkpoint.every=0",
        "steps=100"])
    trainer = Trainer(config)
    canned = {}

    def collect_batch(runner, agent, params, iterator, config, rewarder, seed_for_try, *_):
        seed_for_try(0)
        examples = [Example(i, "needle", "q", "c", ("a",)) for i in canned["kept"]]
        return RolloutBatch(examples, [], np.zeros((0, config.rollout.n), np.float32),
                            canned["drawn"], 1, {"reward/mean": 0.0, "reward/std": 0.0})

    values = []

    def gather(value):  # [process 0's value, this process's]
        values.append(value)
        return [values[0], value]

    monkeypatch.setattr(steps_module, "collect_batch", collect_batch)
    monkeypatch.setattr(collectives, "gather", gather)

    def step_1(drawn, kept, rng_seed):
        canned.update(drawn=drawn, kept=kept)
        trainer.rng = jax.random.key(rng_seed)
        trainer.train_step(1)

    step_1([3, 5, 7], [3, 7], rng_seed=0)  # process 0, compared with itself
    step_1([3, 5, 7], [3, 7], rng_seed=0)  # a process in step
    for drawn, kept, rng_seed in [([3, 5, 8], [3, 8], 0), ([3, 5, 7], [3, 5], 0),
                                  ([3, 5, 7], [3, 7], 1)]:
        with pytest.raises(RuntimeError, match=re.escape(
                "the processes are out of step: step 1's drawn examples, sampling seeds and "
                "kept examples differs on process(es) [1] from process 0")):
            step_1(drawn, kept, rng_seed)


class _NaNAtStep(Trainer):
    """Poisons step 2's advantages, as a diverging loss would."""

    def compute_advantages(self, step, rewards):
        advantages = super().compute_advantages(step, rewards)
        return np.full_like(advantages, np.nan) if step == 2 else advantages


def nan_run(config_path: str, output_dir: str) -> None:
    """(Run in a subprocess by the test below.) Two steps, the second poisoned; then tries to
    checkpoint deliberately non-finite parameters."""
    config = load_train_config(config_path, [
        f"output_dir={output_dir}", "steps=2",
        "checkpoint.every=1", "validation.every=0", "dynamic_sampling.enabled=false"])
    trainer = _NaNAtStep(config)
    trainer.run()
    state = trainer.learner.state()
    trainer.learner.restore(dict(state, params=jax.tree.map(lambda x: x * np.nan,
                                                            state["params"])))
    try:
        trainer.save(3)
    except RuntimeError as e:
        print(f"refused: {e}")


@pytest.mark.slow
def test_a_nan_update_is_skipped_logged_and_never_checkpointed(task, tmp_path):
    out = tmp_path / "run"
    env = multiprocess.environment(devices=1)
    root = str(Path(__file__).resolve().parents[2])
    code = (f"from {__name__} import nan_run; "
            f"nan_run({_write_config(task, tmp_path / 'c.yaml')!r}, {str(out)!r})")
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]

    records = _records(out)
    assert records[0]["learner/updates"] >= 1 and records[0]["learner/skipped_updates"] == 0
    assert records[1]["learner/skipped_updates"] >= 1 and records[1]["learner/updates"] == 0
    assert "step 2: 1 update(s) skipped: non-finite loss" in run.stderr
    # Step 2's checkpoint holds step 1's parameters and Adam state: the NaN never landed. The
    # learning-rate schedule moved on, as verl's steps after every update_actor call.
    checkpoints = str(out / "checkpoints")
    before, after = _saved_state(checkpoints, 1), _saved_state(checkpoints, 2)
    assert (int(before.pop("train_steps")), int(after.pop("train_steps"))) == (1, 2)
    _assert_trees_equal(after, before)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(after))
    # Non-finite parameters are refused outright, whatever the learner did.
    assert "refused: step 3: non-finite parameters; not checkpointed" in run.stdout
    assert not (out / "checkpoints" / "3").exists()


def test_a_step_without_an_update_says_why():
    """Every rollout of every try past its deadline (dynamic sampling dropped their groups,
    so none is left) is said as such, not as rewards that were equal."""
    late = {"rollout/trajectories": 32.0, "rollout/timed_out": 32.0}
    assert no_update_line(4, late, 30.0, 3) == (
        "step 4: every rollout passed rollout.timeout_s = 30 s: no update")
    for record in ({"rollout/trajectories": 32.0, "rollout/timed_out": 5.0},
                   {"rollout/trajectories": 32.0, "rollout/timed_out": 0.0}):
        assert no_update_line(4, record, 30.0, 3) == (
            "step 4: every group's rewards were equal after 3 tries: no update")
