"""A real full disk, where the test can mount one: a 2 MB tmpfs in a mount namespace of its own
(`unshare`; skipped where Linux refuses it). The simulated failures of tests/full_disk.py
cannot show what Orbax and TensorStore print from their own threads once a write has failed
(a traceback for every write still in flight, more at exit); this shows there is none:
`convert` of memagent-tiny (5.6 MB of weights) says one line and leaves nothing, and `train`
(configs/train/tiny_cpu.yaml on a 600 KB disk) says one line after its last step's and announces
no checkpoint that was not kept."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from memagent_jax.data.needle import write_task
from tests import multiprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

UNSHARE = ["unshare", "--mount", "--map-root-user"]


def _can_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run([*UNSHARE, "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount(), reason="no mount namespace to mount a small tmpfs in")
def test_convert_onto_a_full_disk_says_one_line_and_leaves_nothing(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (f"mount -t tmpfs -o size=2m tmpfs {disk} && cd {disk} && "
              f'"$0" -m memagent_jax.cli convert --model memagent-tiny --out ckpt; '
              "status=$?; ls -A; exit $status")
    result = subprocess.run([*UNSHARE, "sh", "-c", script, sys.executable],
                            env=multiprocess.environment(devices=1), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr == (f"memagent-jax: error: no space left on device writing "
                             f"{disk / 'ckpt'}; nothing of it was kept (free some space and "
                             "run the command again)\n")
    assert result.stdout == ""  # `ls -A` of the full disk: nothing left


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount(), reason="no mount namespace to mount a small tmpfs in")
def test_train_onto_a_full_disk_ends_on_its_one_line(tmp_path):
    task = write_task(str(tmp_path / "needle"), train_size=16, val_size=4, seed=3)
    disk = tmp_path / "disk"
    disk.mkdir()
    run = disk / "run"
    config = os.path.join(ROOT, "configs", "train", "tiny_cpu.yaml")
    script = (f"mount -t tmpfs -o size=600k tmpfs {disk} && "
              f'"$0" -m memagent_jax.cli train --config {config} output_dir={run} '
              f"model.tokenizer={task['tokenizer']} data.train=[{task['train']}] "
              f"data.val={task['val']} steps=3 prompts_per_step=4 checkpoint.every=1 "
              "validation.at_start=true validation.size=4 validation.n=1; "
              f"status=$?; ls {run}/checkpoints; exit $status")
    result = subprocess.run([*UNSHARE, "sh", "-c", script, sys.executable],
                            env=multiprocess.environment(devices=1), capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in re.split(r"[\r\n]", result.stderr) if line.strip()]
    assert lines[-1].startswith(f"memagent-jax: error: no space left on device writing "
                                f"{run / 'checkpoints'}; "), lines[-5:]
    assert not [line for line in lines if "Traceback" in line or line.startswith("ERROR")]
    kept = set(result.stdout.split())  # the steps on disk, and the run's model
    announced = re.findall(r"^step (\d+): checkpoint kept in ", result.stderr, re.M)
    assert set(announced) <= kept, (announced, kept)
    assert any(line.startswith("step 0/3 (before training): val ") for line in lines)
