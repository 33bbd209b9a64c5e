"""A pod on one machine: commands run as a job of 2 JAX processes x 4 CPU devices (gloo over
loopback, tests/multiprocess.py) and give what the same command gives on 1 process x 8 devices:
training (three meshes, the same examples, the same parameters), preemption by SIGTERM and
resuming on another process count, export / generate / eval written once (a tool-calling
agent's eval too, its tools run once and shared; an agent whose calls differ between processes
stops them, named), and bad starts."""

import json
import os
import re
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import yaml

from memagent_jax.data.needle import needle_rows, vocabulary, write_rows, write_tokenizer
from memagent_jax.distributed import startup
from memagent_jax.errors import UserError
from memagent_jax.lookup.task import write_task
from tests import multiprocess

pytestmark = pytest.mark.slow  # jobs of 2 processes: minutes

PREFIX = "memagent-jax: error: "


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """Needle rows whose ground truths are 40 words of the vocabulary, so that a random model's
    replies get rewards 0 and 1 (`contains`) and the updates are not all zero; an eval set."""
    root = tmp_path_factory.mktemp("pod")
    words = vocabulary()[6:]
    rng = np.random.default_rng(0)
    rows = needle_rows(16, seed=2)
    for row in rows:
        row["reward_model"]["ground_truth"] = list(rng.choice(words, 40, replace=False))
    paths = {"train": write_rows(rows, str(root / "train.parquet")),
             "tokenizer": write_tokenizer(str(root / "tokenizer")),
             "sets": str(root / "eval_1.json"), "root": root}
    records = [{"context": r["context"], "input": r["prompt"][0]["content"],
                "answers": r["reward_model"]["ground_truth"][:3], "num_docs": 1, "index": i}
               for i, r in enumerate(needle_rows(4, seed=9))]
    with open(paths["sets"], "w") as f:
        json.dump(records, f)
    paths["lookup"] = write_task(str(root / "lookup"), 5, 4, "eval")
    return paths


def _train_config(task, path, mesh: dict, steps: int, every: int = 1) -> str:
    """A tiny run: 4 prompts x n 2 per step, one rollout round, a checkpoint every `every`
    steps."""
    config = {
        "model": {"preset": "tiny", "tokenizer": task["tokenizer"], "compute_dtype": "float32"},
        "mesh": mesh,
        "data": {"train": [task["train"]], "shuffle": True}, "reward": {"function": "contains"},
        "memagent": {"chunk_tokens": 32, "max_memory_tokens": 6, "max_final_tokens": 4,
                     "max_problem_tokens": 8},
        "engine": {"slots": 8, "prefill_buckets": [256]},
        "rollout": {"n": 2},
        # adam_eps 1e-5: AdamW's update lr * g / (|g| + eps) turns float32 noise in a
        # near-zero gradient into up to lr / eps times as much parameter noise.
        "learner": {"lr": 1e-3, "adam_eps": 1e-5, "warmup_steps": 0,
                    "micro_batch_tokens": 4096, "bucket_lengths": [256]},
        "validation": {"every": 0},
        "checkpoint": {"every": every, "keep": 5, "async_save": False},
        "steps": steps, "prompts_per_step": 4, "seed": 5,
        # The session's cache (conftest), given as the config key: every run shares it.
        "compilation_cache_dir": os.environ["JAX_COMPILATION_CACHE_DIR"],
    }
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return str(path)


def _train(task, out, mesh, steps, processes, every=1, code=None):
    """`train` as a job (`code`: a `python -c` program that runs the CLI itself)."""
    config = _train_config(task, out.parent / f"{out.name}.yaml", mesh, steps, every)
    args = ["train", "--config", config, f"output_dir={out}"]
    return multiprocess.start(["-c", code, *args] if code else args, processes,
                              devices=8 // processes)


def _state(out, step) -> dict:
    """Step `step`'s parameters and AdamW moments, read back by Orbax, by path."""
    path = os.path.join(out, "checkpoints", str(step), "state")
    checkpointer = ocp.StandardCheckpointer()
    metadata = dict(checkpointer.metadata(path).item_metadata.tree)  # another topology
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    state = checkpointer.restore(path, jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata))
    return {jax.tree_util.keystr(p): np.asarray(x)
            for p, x in jax.tree_util.tree_leaves_with_path(state) if np.ndim(x)}


def _examples(out) -> list[list[int]]:
    with open(os.path.join(out, "logs", "steps.jsonl")) as f:
        return [json.loads(line)["examples"] for line in f if json.loads(line)["step"]]


def _assert_same_state(a: dict, b: dict) -> None:
    """Equal up to float32 summation order (which differs with the mesh and the collectives),
    leaf by leaf, relative to the leaf's scale."""
    assert a.keys() == b.keys()
    for name in a:
        scale = float(np.abs(b[name]).max())
        assert np.abs(a[name] - b[name]).max() <= 1e-4 * scale, name


@pytest.fixture(scope="module")
def reference(task):
    """Three training steps on 1 process x 8 devices (mesh fsdp 8)."""
    out = task["root"] / "reference"
    multiprocess.check_ok(multiprocess.wait(_train(task, out, {"fsdp": 8}, 3, 1), 300))
    return out


def test_two_processes_train_as_one(task, reference, tmp_path):
    out = tmp_path / "pod"
    results = multiprocess.wait(_train(task, out, {"data": 2, "fsdp": 4}, 2, 2), 300)
    multiprocess.check_ok(results)
    assert "finished step 2 of 2" in results[0].stderr
    assert "finished step" not in results[1].stderr  # process 0 reports, and logs, once
    assert _examples(out) == _examples(reference)[:2]
    assert len({e for step in _examples(out) for e in step}) == 8  # no paired draws
    for step in (1, 2):
        _assert_same_state(_state(out, step), _state(reference, step))


_SIGTERM_IN_STEP_2 = """
import os, signal, sys, time
import jax
from memagent_jax.cli import main
from memagent_jax.distributed.preemption import PreemptionNotice
from memagent_jax.rl.trainer import Trainer

running = [0]
train_step, reached = Trainer.train_step, PreemptionNotice.reached

def recording_train_step(self, step):
    running[0] = step
    return train_step(self, step)

def reached_after_a_signal_in_step_2(self):
    # Process 1 is told to stop after step 2's first turn: mid-rollout, checked by both.
    if running[0] == 2 and jax.process_index() == 1 and not getattr(self, "sent", False):
        self.sent = True
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # the handler runs
    return reached(self)

Trainer.train_step = recording_train_step
PreemptionNotice.reached = reached_after_a_signal_in_step_2
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_mid_rollout_stops_every_process_at_the_previous_step_and_resumes_on_one(
        task, reference, tmp_path):
    out = tmp_path / "pod"
    # A checkpoint every 2 steps: the one of step 1 is written because of the notice, from the
    # state (parameters, RNG, data position) step 2 started from. The job's mesh is all
    # tensor, so that its step 1 is also the check that such a mesh over two processes trains
    # as one process does.
    results = multiprocess.wait(_train(task, out, {"tensor": 8}, 3, 2, every=2,
                                       code=_SIGTERM_IN_STEP_2), 300)
    for result in results:  # 143 (128 + SIGTERM) on both, each saying why in its last line
        assert result.returncode == 143, result.stderr[-3000:]
        assert result.stderr.strip().splitlines()[-1].startswith(
            "memagent-jax: stopped by a preemption notice (SIGTERM) after step 1: step 1 is "
            "checkpointed"), result.stderr[-3000:]
    assert sorted(int(p) for p in os.listdir(out / "checkpoints") if p.isdigit()) == [1]
    _assert_same_state(_state(out, 1), _state(reference, 1))

    # The 2-process checkpoint resumes on 1 process x 8 devices and another mesh, as if never
    # interrupted.
    resumed = multiprocess.wait(_train(task, out, {"fsdp": 8}, 3, 1, every=2), 300)
    multiprocess.check_ok(resumed)
    assert "resuming from step 1" in resumed[0].stderr
    assert _examples(out) == _examples(reference)
    _assert_same_state(_state(out, 3), _state(reference, 3))


_COMMANDS = """
import json, sys
from memagent_jax.cli import main
ckpt, sets, lookup, out, processes = sys.argv[1:6]
tool_eval = ["eval", "--config", "configs/eval/tiny_cpu.yaml",
             "model.path=checkpoints/lookup/start", "data.sets=" + json.dumps([lookup]),
             "method=agent", "sampling.temperature=1.0", "engine.slots=8",
             "engine.prefill_buckets=[256]"]
tools = ("{module: memagent_jax.agents.tool_calling, tools: [memagent_jax.lookup.tools:lookup], "
         "max_turns: 2, max_tokens: 20, max_length: 256}")
commands = [(["export", "--model", ckpt, "--out", out + "/hf", "--max-shard-size", "40KB"], 0),
            (["generate", "--model", out + "/hf", "--input", out + "/../prompts.jsonl",
              "--out", out + "/completions.jsonl", "--max-new-tokens", "6", "--slots", "4"], 0),
            (["eval", "--config", "configs/eval/tiny_cpu.yaml", "model.path=" + out + "/hf",
              "data.sets=" + json.dumps([sets]), "output_dir=" + out + "/eval",
              "engine.slots=8"], 0),
            (tool_eval + ["agent=" + tools, "output_dir=" + out + "/tools"], 0)]
if processes == "2":
    commands.append((tool_eval + ["agent={module: tests.e2e.racy_agent}",
                                  "engine.max_len=256", "output_dir=" + out + "/racy"], 2))
for argv, expected in commands:
    code = main(argv)
    if code != expected:
        sys.exit(code or 1)
"""


def test_export_generate_and_eval_on_two_processes_write_what_one_process_writes(
        task, reference, tmp_path):
    with open(tmp_path / "prompts.jsonl", "w") as f:
        for text in ("what is the secret code ?", "the river runs past", "children play"):
            f.write(json.dumps({"prompt": text}) + "\n")
    outputs = {}
    for processes in (1, 2):
        out = tmp_path / f"p{processes}"
        out.mkdir()
        args = ["-c", _COMMANDS, str(reference / "checkpoints" / "3"), task["sets"],
                task["lookup"], str(out), str(processes)]
        results = multiprocess.run(args, processes, timeout_s=300, devices=8 // processes)
        multiprocess.check_ok(results)
        # Process 0 prints each result once. Gloo's C++ notes its connections on stdout
        # ("[Gloo] Rank 1 is connected to 1 peer ranks. ..."), unbuffered, so a note can be
        # split across lines by other writes: its lines are dropped by either part.
        printed = [[line for line in r.stdout.splitlines()
                    if "[Gloo]" not in line and "peer ranks" not in line] for r in results]
        assert sum(line.startswith("exported") for line in printed[0]) == 1
        assert printed[1:] == [[]] * (processes - 1)
        outputs[processes] = out
    one, two = outputs[1], outputs[2]
    hf_files = sorted(os.listdir(one / "hf"))
    assert sorted(os.listdir(two / "hf")) == hf_files and len(hf_files) > 4  # shards + index
    for name in hf_files:
        assert (one / "hf" / name).read_bytes() == (two / "hf" / name).read_bytes(), name

    def completions(out):
        return [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]

    assert len(completions(two)) == 3
    for a, b in zip(completions(one), completions(two)):
        assert a["completion_ids"] == b["completion_ids"]
        np.testing.assert_allclose(a["logprobs"], b["logprobs"], atol=1e-5)

    def eval_lines(out):
        lines = (out / "eval" / "samples" / "eval_1.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items()} for line in lines]

    assert len(eval_lines(two)) == 4  # each question once
    assert [[r["reply"] for r in line["runs"]] for line in eval_lines(two)] == [
        [r["reply"] for r in line["runs"]] for line in eval_lines(one)]
    assert (two / "eval" / "table.md").read_text() == (one / "eval" / "table.md").read_text()

    # The tool agent (the lookup experiment's start, sampling at temperature 1: calls with
    # keys drawn from the question): the same conversations, tool calls and results.
    def tool_lines(out):
        lines = (out / "tools" / "samples" / "eval_lookup.jsonl").read_text().splitlines()
        return sorted((json.loads(line) for line in lines), key=lambda line: line["row"])

    assert len(tool_lines(two)) == 4
    assert [([r["reply"] for r in line["runs"]], line["agent"]) for line in tool_lines(two)] == [
        ([r["reply"] for r in line["runs"]], line["agent"]) for line in tool_lines(one)]
    assert any(line["agent"]["tool_calls"] > 0 for line in tool_lines(two))
    # The agent whose prompt holds its process's index: both processes stop, naming it.
    for result in results:
        assert ("agent tests.e2e.racy_agent: the processes asked the engine for different "
                "calls") in result.stderr.strip().splitlines()[-1]


def test_bad_starts_end_every_process_with_one_line(task, tmp_path):
    # A coordinator that never answers: process 1 of 2 alone.
    start = time.monotonic()
    (result,) = multiprocess.run(["convert", "--model", str(tmp_path / "none"), "--out",
                                  str(tmp_path / "x"), "--start-timeout", "5"], 1,
                                 timeout_s=60, env_for=lambda i, env: env.update(
                                     JAX_COORDINATOR_ADDRESS=f"127.0.0.1:"
                                     f"{multiprocess.free_port()}",
                                     JAX_NUM_PROCESSES="2", JAX_PROCESS_ID="1"))
    assert result.returncode == 2 and time.monotonic() - start < 50
    (line,) = [x for x in result.stderr.splitlines() if x.startswith(PREFIX)]
    assert "did not all join within 5 s" in line and "process 1 of 2" in line

    # Mismatched process counts: process 1 thinks the job has 3.
    def three(i, env):
        if i == 1:
            env["JAX_NUM_PROCESSES"] = "3"

    config = _train_config(task, tmp_path / "c.yaml", {"fsdp": -1}, 1)
    results = multiprocess.run(["train", "--config", config, f"output_dir={tmp_path / 'o'}",
                                "--start-timeout", "20"], 2, timeout_s=90, env_for=three)
    for r in results:
        assert r.returncode == 2, r.stderr[-2000:]
        (line,) = [x for x in r.stderr.splitlines() if x.startswith(PREFIX)]
        assert "process 0: 2, process 1: 3" in line

    # Hosts that do not share the checkpoint directory: `~` is another directory on each.
    def own_home(i, env):
        env["HOME"] = str(tmp_path / f"home{i}")

    results = multiprocess.run(["train", "--config", config, "output_dir=~/run"], 2,
                               timeout_s=90, env_for=own_home)
    for r in results:
        assert r.returncode == 2, r.stderr[-2000:]
        (line,) = [x for x in r.stderr.splitlines() if x.startswith(PREFIX)]
        assert "process(es) [1] do not see what process 0 writes there" in line
    assert os.listdir(tmp_path / "home0" / "run" / "checkpoints") == []  # the marker is gone

    # A mesh that does not divide the job's 8 devices.
    results = multiprocess.run(["train", "--config", config, f"output_dir={tmp_path / 'o'}",
                                "mesh={data: 3, fsdp: -1}"], 2, timeout_s=90)
    for r in results:
        assert r.returncode == 2, r.stderr[-2000:]
        (line,) = [x for x in r.stderr.splitlines() if x.startswith(PREFIX)]
        assert "mesh: 8 devices do not divide by 3" in line


@pytest.mark.parametrize("launch, env, message", [
    (startup.Launch(), {"JAX_NUM_PROCESSES": "2"},
     "JAX_COORDINATOR_ADDRESS, JAX_PROCESS_ID not set"),
    (startup.Launch("h:1", 2, 2), {}, "--process-id 2 is not in 0..1 (--num-processes 2)"),
    (startup.Launch("h:1", 2), {}, "--process-id missing"),
    (startup.Launch(), {"JAX_COORDINATOR_ADDRESS": "h", "JAX_NUM_PROCESSES": "2",
                        "JAX_PROCESS_ID": "0"},
     "JAX_COORDINATOR_ADDRESS 'h': expected HOST:PORT"),
])
def test_start_up_coordinates_are_checked_before_anything_starts(monkeypatch, launch, env,
                                                                 message):
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=re.escape(message)):
        startup.start(launch)
    assert not startup.joined()


class _Unpublished(Exception):
    """A process read a key no process has published yet (the real store would wait)."""


class _KeyValueStore:
    """The coordinator's key-value store, shared by a job's processes (the two calls of JAX's
    client that the start-up agreement makes)."""

    def __init__(self):
        self.values = {}

    def key_value_set(self, key, value):
        self.values[key] = value

    def blocking_key_value_get(self, key, timeout_in_ms):
        if key not in self.values:
            raise _Unpublished(key)
        return self.values[key]


@pytest.mark.parametrize("argv_1, refused", [
    (["train", "--config", "c.yaml", "steps=3", "--process-id", "1"], False),
    (["train", "--config", "c.yaml", "steps=4", "--process-id", "1"], True),
    (["train", "--config", "other.yaml", "steps=3", "--process-id", "1"], True),
    (["eval", "--config", "c.yaml", "steps=3", "--process-id", "1"], True),
], ids=["the same", "another override", "another config", "another command"])
def test_processes_started_with_different_command_lines_are_refused(monkeypatch, argv_1,
                                                                    refused):
    """What `start` does once JAX has joined the processes, for a job of 2 whose process 1 is
    told `argv_1`: each publishes its process count and command line, process 1 first, and
    process 0 then compares them all (the start-up flags aside): `startup.check_agreement`,
    its coordination service a stand-in store."""
    from memagent_jax import commandline
    from memagent_jax.cli import build_parser

    store = _KeyValueStore()
    monkeypatch.setattr(startup, "coordination_client", lambda: store)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(startup, "start", lambda launch, fingerprint="": (
        startup.check_agreement(launch.num_processes, fingerprint, 1)))

    def join(process, argv):
        monkeypatch.setattr(jax, "process_index", lambda: process)
        commandline.start(build_parser().parse_args(
            [*argv, "--coordinator", "h:1", "--num-processes", "2"]))

    with pytest.raises(_Unpublished):  # process 1 waits for process 0
        join(1, argv_1)
    argv_0 = ["train", "--config", "c.yaml", "steps=3", "--process-id", "0"]
    if not refused:
        join(0, argv_0)
        return
    with pytest.raises(UserError, match=re.escape(
            "process(es) [1] were started differently from process 0 (another command, config "
            "or flags): every process of a job runs the same command line")):
        join(0, argv_0)


_COLLECTIVES = """
import os, signal, sys, time
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from memagent_jax.distributed import collectives, startup
from memagent_jax.distributed.preemption import PreemptionNotice
from memagent_jax.fileutil import atomic_directory
from memagent_jax.models.sharding import make_mesh
startup.start()
me = jax.process_index()
mesh = make_mesh({"fsdp": -1})
split = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, PartitionSpec("fsdp")))
assert (collectives.to_host(split) == np.arange(16.0)).all()
assert collectives.gather({"p": me}) == [{"p": 0}, {"p": 1}]
assert collectives.broadcast(f"from {me}") == "from 0"
collectives.check_same("the same value", 7)
assert collectives.on_main(lambda: f"made by {me}") == "made by 0"
try:
    collectives.on_main(lambda: 1 / 0)
except (ZeroDivisionError, RuntimeError) as e:
    print("on_main:", type(e).__name__, e, flush=True)

# Process 0 fails alone while writing: every process raises, nothing is left behind.
out = sys.argv[1] + "/written"
try:
    with atomic_directory(out) as tmp:
        if me == 0:
            raise OSError("disk full")
except (OSError, RuntimeError) as e:
    print("atomic_directory:", type(e).__name__, e, flush=True)
assert not os.listdir(sys.argv[1])
with atomic_directory(out) as tmp:
    if me == 0:
        with open(tmp + "/file", "w") as f:
            f.write("by 0")
assert open(out + "/file").read() == "by 0"  # renamed before any process returns

# SIGTERM to process 1: both processes see it at the same call.
with PreemptionNotice() as notice:
    assert not notice.reached()
    if me == 1:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
    assert notice.reached() and not notice.interrupted
# Ctrl-C on process 1 as process 0 gets SIGTERM: both stop for the Ctrl-C.
with PreemptionNotice() as notice:
    os.kill(os.getpid(), signal.SIGINT if me == 1 else signal.SIGTERM)
    time.sleep(0.2)
    assert notice.reached() and notice.interrupted
print("collectives ok", flush=True)
collectives.check_same("the drawn examples", [1, 2, me])
"""


def test_host_collectives_and_the_lockstep_check(tmp_path):
    results = multiprocess.run(["-c", _COLLECTIVES, str(tmp_path)], 2, timeout_s=120)
    assert "on_main: ZeroDivisionError division by zero" in results[0].stdout
    assert "on_main: RuntimeError process 0 failed: division by zero" in results[1].stdout
    assert "atomic_directory: OSError disk full" in results[0].stdout
    assert f"atomic_directory: RuntimeError {tmp_path}/written: process(es) [0] failed" in (
        results[1].stdout)
    for r in results:
        assert "collectives ok" in r.stdout and r.returncode == 1, r.stderr[-2000:]
        assert ("RuntimeError: the processes are out of step: the drawn examples differs on "
                "process(es) [1] from process 0") in r.stderr


_INDEPENDENT_COLLECTIVES = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from memagent_jax.distributed import startup
startup.start()
mesh = jax.make_mesh((jax.device_count(),), ("d",))
count = 8
def sums(*xs):  # none waits for another, so XLA may start a device's sums together
    return tuple(jax.lax.psum(jnp.tanh(x) * (i + 1.0), "d") for i, x in enumerate(xs))
f = jax.jit(jax.shard_map(sums, mesh=mesh, in_specs=(P("d"),) * count,
                          out_specs=(P(),) * count))
whole = np.ones((64 * jax.device_count(), 256), np.float32)
xs = [jax.make_array_from_callback(whole.shape, NamedSharding(mesh, P("d")),
                                   lambda index: whole[index]) for _ in range(count)]
for _ in range(100):
    out = f(*xs)
jax.block_until_ready(out)
print("sums ok", flush=True)
"""


@pytest.mark.parametrize("processes, devices", [(1, 8), (2, 4)])
def test_independent_collectives_on_simulated_devices_finish(processes, devices):
    """XLA's CPU client runs all simulated devices on one thread pool, as many threads as
    devices on this 2-core machine; without `startup.reserve_cpu_threads` a device that
    starts two collectives at once leaves another without a thread, and all of them wait."""
    def unreserved(i, env):
        env.pop("NPROC", None)  # conftest's reservation: the job must make its own
        env["XLA_FLAGS"] += " --xla_cpu_collective_call_terminate_timeout_seconds=30"

    results = multiprocess.run(["-c", _INDEPENDENT_COLLECTIVES], processes, timeout_s=120,
                               devices=devices, env_for=unreserved)
    multiprocess.check_ok(results)
    assert all("sums ok" in r.stdout for r in results)


@pytest.mark.parametrize("env, cores, nproc", [
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}, 2, "16"),
    ({"XLA_FLAGS": "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=4"}, 2, "8"),
    ({"JAX_NUM_CPU_DEVICES": "4"}, 2, "8"),
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "NPROC": "3"}, 2, "3"),  # theirs
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}, 64, None),  # the cores suffice
    ({}, 2, None)])
def test_the_thread_reservation_follows_the_simulated_device_count(monkeypatch, env, cores, nproc):
    for name in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES", "NPROC"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    startup.reserve_cpu_threads()
    assert os.environ.get("NPROC") == nproc
