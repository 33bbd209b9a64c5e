"""Training checkpoints with Orbax: atomic, keep-last-N, exact resume, multi-host aware.

A checkpoint is one step directory `<dir>/<step>/` of an Orbax `CheckpointManager`, with items:
- `state`: the learner's pytree {params, opt_state, step} (sharded arrays; every process writes
  its shards, and restore puts each array back on the sharding of the target it is given);
- `meta`:  JSON written by process 0: the trainer step, the RNG key data, the data iterator's
  position (`data`; the same on every process, so a checkpoint of N processes resumes on any
  number), and whatever else the trainer needs to continue exactly; under LoRA, where `state`
  holds the adapters, the base they train on (`base`: its path and
  `models.checkpoint.weights_fingerprint`).

Atomicity is Orbax's: a step is written under a temporary name and renamed to `<step>` only when
every item of every process is complete (on object stores a commit marker plays that part), so
a crash mid-save leaves the previous steps as they were, and the half-written directory is never
listed as a step (it is cleaned up by the next manager). `keep` bounds the steps kept.

A write that fills the disk (found by whichever call comes next: an async save fails in the
background) is a UserError naming the directory and the newest step kept, once the step being
written is removed: the steps before it are as they were, and the same command resumes from
the newest of them once there is space.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Any

import jax

from memagent_jax.distributed import collectives
from memagent_jax.errors import UserError
from memagent_jax.fileutil import disk_full_error, is_disk_full


class Checkpointer:
    """save(step, state, meta, data_iterator) / restore(target, data_iterator); see the module
    docstring. async_save: the arrays are copied to host memory during save() and written in
    a background thread while training goes on; wait() blocks until the last save committed;
    newly_kept() says which saves have committed since it was last asked."""

    def __init__(self, directory: str, keep: int | None = 3, async_save: bool = True):
        import orbax.checkpoint as ocp

        from memagent_jax.models.checkpoint import quiet_failed_writes
        quiet_failed_writes()

        # gs:// and other remote URLs go to Orbax as they are (it writes them natively).
        self.directory = directory if "://" in directory else os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True)
        self._manager = ocp.CheckpointManager(
            self.directory, options=options,
            item_handlers={"state": ocp.StandardCheckpointHandler(),
                           "meta": ocp.JsonCheckpointHandler()})
        self._unreported: list[int] = []  # steps saved here, not yet reported committed

    def latest_step(self) -> int | None:
        """The newest committed step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: Any, meta: dict, data_iterator=None) -> None:
        """Starts writing checkpoint `step` (see async_save). The data iterator's position is
        read now, synchronously, so later draws do not leak into this checkpoint."""
        import orbax.checkpoint as ocp

        if data_iterator is not None:
            meta = {**meta, "data": data_iterator.get_state()}
        items = {"state": ocp.args.StandardSave(state),
                 "meta": ocp.args.JsonSave(_plain(meta))}
        with self._writing():
            self._manager.save(step, args=ocp.args.Composite(**items), force=True)
        self._unreported.append(step)

    def newly_kept(self) -> list[int]:
        """The steps saved here that have committed since the last call, oldest first, each
        once: what a run announces as kept. Read from the directory (a step is there once it
        has committed); a step older than the newest committed one has committed too, even
        where `keep` has removed it since (Orbax commits saves in order)."""
        if not self._unreported:
            return []
        newest = max(committed_steps(self.directory), default=None)
        kept = [s for s in self._unreported if newest is not None and s <= newest]
        self._unreported = self._unreported[len(kept):]
        return kept

    def restore(self, target: Any, data_iterator=None, step: int | None = None
                ) -> tuple[Any, dict]:
        """(state, meta) of `step` (default the latest). target: a pytree like the saved state
        (arrays or jax.ShapeDtypeStruct): its shapes, dtypes and shardings are what is
        restored. data_iterator, when given, is moved to the saved position in place."""
        import orbax.checkpoint as ocp

        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"{self.directory}: no checkpoint to restore")
        items = {"state": ocp.args.StandardRestore(abstract_like(target)),
                 "meta": ocp.args.JsonRestore()}
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        except ValueError as e:  # Orbax's tree mismatch: a page of both trees
            raise UserError(
                f"{self.directory}/{step}: the saved state does not match this run's model and "
                f"optimiser ({str(e).splitlines()[0][:200]}); checkpoints of another model, or "
                "of an older memagent-jax layout, cannot be resumed") from None
        meta = dict(restored["meta"])
        if data_iterator is not None:
            if "data" not in meta:
                raise UserError(f"{self.directory}/{step}: written by an older memagent-jax "
                                "(the data position per process), so the run cannot resume "
                                "exactly; start a new output_dir")
            data_iterator.set_state(meta["data"])
        return restored["state"], meta

    def wait(self) -> None:
        """Blocks until every started save has committed."""
        with self._writing():
            self._manager.wait_until_finished()

    def close(self) -> None:
        self.wait()
        self._manager.close()

    @contextlib.contextmanager
    def _writing(self):
        """Where a save's failure surfaces: a full disk becomes the module docstring's
        UserError, after process 0 removed the uncommitted step."""
        try:
            yield
        except Exception as e:
            if not is_disk_full(e) or "://" in self.directory:
                raise
            import orbax.checkpoint as ocp
            if collectives.is_main():  # no collective: the other processes may not fail here
                for name in ocp.path.step.tmp_checkpoints(self.directory):
                    shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
            steps = committed_steps(self.directory)
            kept = (f"the newest checkpoint is step {steps[-1]}" if steps
                    else "no checkpoint was kept")
            raise disk_full_error(self.directory, f"{kept}; free some space and run the same "
                                                  "command to resume") from None


def committed_steps(directory: str) -> list[int]:
    """The committed steps in a checkpoint directory (none where it does not exist), read
    without a manager: before any device work, the trainer learns whether it resumes."""
    import orbax.checkpoint as ocp
    return sorted(ocp.path.step.checkpoint_steps(directory))


def abstract_like(tree: Any) -> Any:
    """Arrays -> ShapeDtypeStruct with their sharding (what restore needs to place them);
    other leaves (Python/NumPy scalars) as they are."""
    def leaf(x):
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        return x
    return jax.tree.map(leaf, tree)


def _plain(value):
    """JSON-able copy (tuples -> lists, NumPy scalars -> Python numbers)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return value

