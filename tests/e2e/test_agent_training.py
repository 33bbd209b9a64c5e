"""The agent docs/agents.md writes, trained as the page says: its two files written as they
stand there, its `train` command run as it stands (on a tiny random model and a few rows of the
built-in lookup task). First with a reward that raises on one row: the run stops before that
step is applied, in one line naming the function and the row, the step before it
checkpointed (committed before the error is reported, however slow the commit); then, the
reward fixed (the page's), the same command resumes and finishes."""

import json
import os
import re
import shlex
import sys
import threading

import pytest

from memagent_jax.cli import main
from memagent_jax.lookup.task import write_task
from memagent_jax.rl.checkpointing import Checkpointer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = "memagent-jax: error: "
FLAKY_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info):
    if extra_info["index"] == 2:
        raise ValueError("a bad row")
    return 0.0
'''


def _page():
    """(the page's python files by name, its last shell command's argv)."""
    with open(os.path.join(ROOT, "docs", "agents.md"), encoding="utf-8") as f:
        page = f.read()
    files = {}
    for block in re.findall(r"```python\n(.*?)```", page, re.DOTALL):
        name = re.match(r"# (\w+\.py)\n", block)
        if name:
            files[name.group(1)] = block
    commands = re.findall(r"```bash\n(.*?)```", page, re.DOTALL)[0]
    last = commands.replace("\\\n", " ").strip().splitlines()[-1]
    argv = shlex.split(last)
    assert argv[:2] == ["PYTHONPATH=.", "memagent-jax"], last
    return files, argv[2:]


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    """A directory on sys.path (the page's PYTHONPATH=.), left with the test."""
    directory = tmp_path / "modules"
    directory.mkdir()
    monkeypatch.syspath_prepend(str(directory))
    yield directory
    for name in ("my_agent", "my_reward"):
        sys.modules.pop(name, None)


@pytest.fixture
def slow_commits(monkeypatch):
    """Orbax commits a checkpoint (renames its temporary directory to the step) only once
    the trainer waits for it, or after 60 s: a loaded machine, where the next step's error
    can come before the commit of the step before it."""
    import orbax.checkpoint as ocp

    waited = threading.Event()
    finalize, wait = ocp.CheckpointManager._finalize, Checkpointer.wait

    def late_finalize(manager, *args, **kwargs):
        waited.wait(60)
        return finalize(manager, *args, **kwargs)

    def waiting(checkpointer):
        waited.set()
        wait(checkpointer)

    monkeypatch.setattr(ocp.CheckpointManager, "_finalize", late_finalize)
    monkeypatch.setattr(Checkpointer, "wait", waiting)
    yield
    waited.set()  # a commit nobody waited for ends now


@pytest.mark.slow
def test_the_documented_agent_trains_as_the_page_says(tmp_path, module_dir, slow_commits,
                                                      capsys):
    files, argv = _page()
    assert set(files) == {"my_agent.py", "my_reward.py"}
    (module_dir / "my_agent.py").write_text(files["my_agent.py"])
    (module_dir / "my_reward.py").write_text(FLAKY_REWARD)
    data = tmp_path / "lookup"
    write_task(str(data), 1, 8, "train")
    small = [f"output_dir={tmp_path / 'run'}", "model.path=null", "model.preset=tiny",
             f"model.tokenizer={data / 'tokenizer'}", f"data.train=[{data / 'train.parquet'}]",
             "data.val=null", "data.shuffle=false", "validation.every=0",
             "validation.at_start=false", "steps=3", "prompts_per_step=2", "rollout.n=4",
             "dynamic_sampling.enabled=false", "engine.slots=8", "checkpoint.every=1",
             "compilation_cache_dir=null"]
    assert argv[:3] == ["train", "--config", "configs/lookup/01_dapo.yaml"]
    argv = ["train", "--config", os.path.join(ROOT, argv[2]), *argv[3:], *small]

    # Rows 0-1 are step 1's, rows 2-3 step 2's: the reward raises on row 2.
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"{PREFIX}reward my_reward.compute_score: row 2 (lookup): raised "
                       "ValueError: a bad row")
    run = tmp_path / "run"
    assert sorted(os.listdir(run / "checkpoints")) == ["1", "model"]
    assert [json.loads(line)["step"] for line in open(run / "logs" / "steps.jsonl")] == [1]

    (module_dir / "my_reward.py").write_text(files["my_reward.py"])  # the page's reward
    assert main(argv) == 0
    records = [json.loads(line) for line in open(run / "logs" / "steps.jsonl")]
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        assert record["rollout/trajectories"] == 8 and record["time/reward_s"] > 0
        assert 0 <= record["agent/tool_calls"] <= 2 and record["learner/rows"] == 8
        assert "rollout/memory_length" not in record  # MemAgent's: this agent has no memory
        # one row a rollout: every reply of a conversation, its tool results masked
        assert record["rollout/replies"] >= 1
    assert records[1]["examples"] == [2, 3]
