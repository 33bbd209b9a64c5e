"""A real full disk, where the test can mount one: a 2 MB tmpfs in a mount namespace of its own
(`unshare`; skipped where Linux refuses it). The simulated failures of tests/full_disk.py
cannot show what Orbax and TensorStore print from their own threads once a write has failed
(a traceback for every write still in flight, more at exit); this shows there is none:
`convert` of memagent-tiny (5.6 MB of weights) says one line and leaves nothing."""

import shutil
import subprocess
import sys

import pytest

from tests import multiprocess

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
