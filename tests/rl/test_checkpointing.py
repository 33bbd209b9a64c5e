"""Training checkpoints (rl/checkpointing.py): Orbax restore equality on a sharded mesh, the data
iterator's position, keep-last-N, and atomicity under SIGKILL mid-save."""

import os
import signal
import subprocess
import sys

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from memagent_jax import model_dir
from memagent_jax.errors import UserError
from memagent_jax.models.sharding import make_mesh
from memagent_jax.rl.checkpointing import Checkpointer
from tests import multiprocess
from tests.full_disk import fail_orbax_writes


def _iterator(seed=7):
    """A shuffled, endless grain iterator like the trainer's."""
    ds = grain.MapDataset.range(23).shuffle(seed=seed).repeat(None)
    return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)))


def _train_state(mesh, scale=1.0):
    """{params, opt_state, step} after one real AdamW step, parameters sharded over the mesh."""
    fsdp = NamedSharding(mesh, PartitionSpec("fsdp", None))
    tensor = NamedSharding(mesh, PartitionSpec(None, "tensor"))
    params = {"embed": jax.device_put(jnp.arange(16 * 6, dtype=jnp.float32).reshape(16, 6)
                                      * scale, fsdp),
              "layers": {"w": jax.device_put(jnp.ones((4, 8), jnp.bfloat16) * scale, tensor)}}
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.01))
    opt_state = tx.init(params)
    grads = jax.tree.map(lambda p: jnp.sin(p.astype(jnp.float32)).astype(p.dtype), params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return {"params": optax.apply_updates(params, updates), "opt_state": opt_state,
            "step": jnp.int32(1)}


def _assert_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow
def test_restore_gives_back_every_array_on_its_sharding_and_the_data_position(tmp_path):
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    state = _train_state(mesh)
    rng = jax.random.key(3)
    iterator = _iterator()
    drawn = [next(iterator) for _ in range(30)]  # past the first epoch: a new permutation
    checkpointer = Checkpointer(str(tmp_path / "ckpt"), keep=3, async_save=True)
    checkpointer.save(1, state, {"step": 1, "rng": np.asarray(jax.random.key_data(rng))},
                      iterator)
    following = [next(iterator) for _ in range(10)]  # drawn after the save: not in it
    checkpointer.close()

    target = jax.tree.map(jnp.zeros_like, _train_state(mesh, scale=0.0))
    fresh = _iterator()
    restored, meta = Checkpointer(str(tmp_path / "ckpt")).restore(target, fresh)
    _assert_equal(restored, state)
    for x, y in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
        assert x.sharding == y.sharding
    assert meta["step"] == 1
    assert jax.random.key_data(jax.random.wrap_key_data(np.asarray(meta["rng"], np.uint32))
                               ).tolist() == jax.random.key_data(rng).tolist()
    assert [next(fresh) for _ in range(10)] == following
    assert len(drawn) == 30


def test_keeps_only_the_last_n_steps(tmp_path):
    mesh = make_mesh({"fsdp": -1})
    checkpointer = Checkpointer(str(tmp_path), keep=2, async_save=True)
    for step in range(1, 6):
        checkpointer.save(step, _train_state(mesh, scale=step), {"step": step})
    checkpointer.wait()
    assert checkpointer.all_steps() == [4, 5]
    assert sorted(p for p in os.listdir(tmp_path) if p.isdigit()) == ["4", "5"]
    restored, meta = checkpointer.restore(_train_state(mesh))
    _assert_equal(restored, _train_state(mesh, scale=5))
    assert meta["step"] == 5
    checkpointer.close()


@pytest.mark.parametrize("async_save", [True, False], ids=["async", "sync"])
def test_a_save_is_reported_kept_once_it_has_committed_and_a_failed_one_never(
        tmp_path, monkeypatch, async_save):
    """`newly_kept`: each committed step once, oldest first, those `keep` removed since
    included; a step whose write failed (a full disk) is never reported."""
    mesh = make_mesh({"fsdp": -1})
    directory = str(tmp_path / "ckpt")
    checkpointer = Checkpointer(directory, keep=1, async_save=async_save)
    assert checkpointer.newly_kept() == []
    checkpointer.save(1, _train_state(mesh), {"step": 1})
    checkpointer.save(2, _train_state(mesh, scale=2.0), {"step": 2})  # 1 committed first
    reported = checkpointer.newly_kept()
    assert reported in ([1], [1, 2]) if async_save else reported == [1, 2]
    checkpointer.wait()
    assert reported + checkpointer.newly_kept() == [1, 2]
    assert checkpointer.newly_kept() == []
    assert os.listdir(directory) == ["2"]  # keep=1: step 1 removed, yet it was kept
    failed = fail_orbax_writes(monkeypatch, lambda where: "3.orbax-checkpoint-tmp" in where)
    with pytest.raises(UserError):
        checkpointer.save(3, _train_state(mesh, scale=3.0), {"step": 3})
        checkpointer.wait()
    assert failed and checkpointer.newly_kept() == []


def test_no_checkpoint_to_restore_is_an_error(tmp_path):
    checkpointer = Checkpointer(str(tmp_path / "empty"))
    assert checkpointer.latest_step() is None
    with pytest.raises(FileNotFoundError):
        checkpointer.restore({"x": jnp.zeros(2)})


_CRASH = """
import os, signal, sys, threading, time
import jax.numpy as jnp
from memagent_jax.rl.checkpointing import Checkpointer

def die_mid_save(directory):
    # SIGKILL as soon as step 2's temporary directory exists, while its arrays are written.
    while not any(p.startswith("2.") for p in os.listdir(directory)):
        time.sleep(0.0005)
    os.kill(os.getpid(), signal.SIGKILL)

checkpointer = Checkpointer(sys.argv[1], keep=3, async_save=True)
checkpointer.save(1, {"w": jnp.arange(4096.0), "step": jnp.int32(1)}, {"step": 1})
checkpointer.wait()
threading.Thread(target=die_mid_save, args=(sys.argv[1],), daemon=True).start()
checkpointer.save(2, {"w": jnp.ones(1 << 26) * 2, "step": jnp.int32(2)}, {"step": 2})
checkpointer.wait()
"""


def test_a_crash_mid_save_leaves_the_previous_checkpoint_usable(tmp_path):
    directory = str(tmp_path / "ckpt")
    env = multiprocess.environment(devices=1)
    run = subprocess.run([sys.executable, "-c", _CRASH, directory], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    leftovers = [p for p in os.listdir(directory) if not p.isdigit()]
    assert any(p.startswith("2.") and "tmp" in p for p in leftovers), os.listdir(directory)

    checkpointer = Checkpointer(directory, keep=3)
    assert checkpointer.latest_step() == 1  # the half-written step is not a step
    target = {"w": jnp.zeros(4096), "step": jnp.int32(0)}
    restored, meta = checkpointer.restore(target)
    np.testing.assert_array_equal(restored["w"], np.arange(4096.0))
    assert meta == {"step": 1}

    # Saving the same step again works, and the half-written directory is gone.
    checkpointer.save(2, {"w": jnp.arange(4096.0) * 2, "step": jnp.int32(2)}, {"step": 2})
    checkpointer.close()
    assert sorted(os.listdir(directory)) == ["1", "2"]
    restored, _ = Checkpointer(directory).restore(target)
    np.testing.assert_array_equal(restored["w"], np.arange(4096.0) * 2)


@pytest.mark.parametrize("async_save", [True, False], ids=["async", "sync"])
def test_a_full_disk_removes_the_step_being_written_and_keeps_the_others(tmp_path,
                                                                         monkeypatch,
                                                                         async_save):
    """Step 2's arrays fail to write as on a full disk (tests/full_disk.py; an async save
    fails in Orbax's thread and surfaces at the next call): one UserError naming the directory
    and the step kept, step 2's partial directory removed, step 1 restores as it was saved,
    and a new checkpointer saves step 2 once there is space."""
    mesh = make_mesh({"fsdp": -1})
    directory = str(tmp_path / "ckpt")
    checkpointer = Checkpointer(directory, keep=3, async_save=async_save)
    checkpointer.save(1, _train_state(mesh), {"step": 1})
    checkpointer.wait()
    failed = fail_orbax_writes(monkeypatch, lambda where: "2.orbax-checkpoint-tmp" in where)
    with pytest.raises(UserError) as error:
        checkpointer.save(2, _train_state(mesh, scale=2.0), {"step": 2})
        checkpointer.wait()
    assert failed
    assert str(error.value) == (f"no space left on device writing {directory}; the newest "
                                "checkpoint is step 1; free some space and run the same "
                                "command to resume")
    assert os.listdir(directory) == ["1"]
    monkeypatch.undo()
    again = Checkpointer(directory, keep=3, async_save=async_save)
    restored, meta = again.restore(_train_state(mesh, scale=0.0))
    _assert_equal(restored, _train_state(mesh))
    assert meta == {"step": 1}
    again.save(2, _train_state(mesh, scale=2.0), {"step": 2})
    again.close()
    assert sorted(os.listdir(directory)) == ["1", "2"]


def test_restoring_into_another_tree_is_one_clear_error(tmp_path):
    """A checkpoint of another parameter tree (another depth, or the stacked layers of older
    versions) is refused with a UserError naming the step directory, not Orbax's dump of both
    trees."""
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    checkpointer = Checkpointer(str(tmp_path / "ckpt"), keep=3, async_save=False)
    checkpointer.save(1, _train_state(mesh), {"step": 1})
    other = _train_state(mesh)
    other["params"]["layers"] = {0: other["params"]["layers"]["w"]}
    with pytest.raises(UserError, match=r"ckpt/1: the saved state does not match"):
        checkpointer.restore(other)
    checkpointer.close()



@pytest.mark.parametrize("order", [sorted, lambda names: sorted(names, reverse=True),
                                   lambda names: sorted(names, key=lambda n: n[::-1])],
                         ids=["ascending", "descending", "scrambled"])
def test_a_runs_newest_step_is_found_whatever_order_the_directory_lists(tmp_path, monkeypatch,
                                                                        order):
    """`run`, `export` and the other commands read a run's newest finished step: step 10 of
    2, 3, 9 and 10 (the largest number, not the last name listed nor the largest string),
    never an unfinished one."""
    checkpoints = tmp_path / "run" / "checkpoints"
    (checkpoints / model_dir.TRAINING_MODEL_DIR).mkdir(parents=True)
    (checkpoints / model_dir.TRAINING_MODEL_DIR / model_dir.CONFIG_FILE).write_text("{}")
    for step in ("2", "3", "9", "10", "11.orbax-checkpoint-tmp-5"):
        (checkpoints / step / model_dir.TRAINING_STATE).mkdir(parents=True)
    listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path: order(listdir(path)))
    for path in (tmp_path / "run", checkpoints):
        assert model_dir.training_step_dir(str(path)) == str(checkpoints / "10")
