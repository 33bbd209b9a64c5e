"""The RL training loop: `memagent-jax train --config FILE key=value ...`.

Per step: draw rows (grain iterator) -> n rollouts per row of the config's agent
(rollout/agent_api.py; MemAgent unless `agent.module` names another) on the decoding engine,
with the learner's current parameters -> rewards, overlong shaping, dynamic sampling
(collect.py) -> group advantages -> training rows (one per conversation) -> `Learner.update`
(PPO mini-batches) -> periodic validation with the lenient metrics -> Orbax checkpoint ->
TensorBoard scalars and one JSON line per step. The agent and plugin the config names are built
first (rl/build.py); the step's kind (steps.py, the learner's) collects and groups its batch:
with `learner.loss: sft` the rollouts are a plugin's (rl/plugin.py) target trajectories
instead (a supervised step, no sampling) with its extra rows beside them; a DAPO step rolls out a
plugin's starts beside the drawn rows (which the plugin may make by rolling out the current
policy on the same runner: `StepContext.rollouts`). Rollouts decode with the engine's copy of
`learner.params` (`Engine.place`): the learner's own arrays where they are stored in the
compute dtype and the rollout's layout (one device, float32 on CPU), else a device copy (bf16
from float32 master weights, split over tensor only), made on the same mesh at each rollout
and dropped when it ends, so it never sits beside the update's gradients.

Everything a step depends on is in the checkpoint (parameters, optimiser state, step, the RNG
key that seeds the rollouts, the data iterator's position), and the learner's own shuffling is
seeded by (seed, optimiser step), so a run killed at any point and resumed from its last
checkpoint repeats exactly what the uninterrupted run does: same examples, same samples, same
parameters. `logs/steps.jsonl` records each step's drawn example indices to show it.

Setup checks every input (config, data sources, model and tokenizer directories, the mesh
against the devices) before a model is loaded or anything is compiled, keeps the resolved config
in `output_dir/config.yaml` (a resume that changes other keys than `config.RESUMABLE` is
refused, each change named) and prints what the run is about to do.

On many processes (a pod; `memagent_jax.distributed`), every process reads the same examples
and drives the whole global batch through the SPMD engine and learner (their arrays are split
over every host's devices; rewards and rows are computed on each host, identically); only
process 0 writes logs. Each step checks that the hosts agree on what they drew and sampled, and
at start-up that they all see the same checkpoint directory. SIGTERM (a preemption notice)
and Ctrl-C (SIGINT) stop the run the same way, at the next turn or step boundary, on every
process at once: the step in flight is finished (its rollouts were done) or abandoned (in the
middle of its rollouts), the state of the last completed step, whose line was printed, is
checkpointed with its data position, and the command exits 143 for SIGTERM, 130 for Ctrl-C
(`Interrupted`; never 0, which says the run finished); rerunning it resumes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from memagent_jax import model_dir
from memagent_jax.console import announce, progress_bar
from memagent_jax.data import pipeline
from memagent_jax.distributed import collectives, startup
from memagent_jax.distributed.preemption import PreemptionNotice
from memagent_jax.engine.factory import load_model_section
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.errors import ConfigError, Interrupted, UserError
from memagent_jax.eval.metrics import qa_scores
from memagent_jax.extras import needs
from memagent_jax.fileutil import check_output_dir, disk_full_error, is_disk_full
from memagent_jax.models import checkpoint
from memagent_jax.models.checkpoint import base_name, weights_fingerprint
from memagent_jax.models.sharding import make_mesh
from memagent_jax.rl import plugin
from memagent_jax.rl.advantages import group_advantages
from memagent_jax.rl.build import build_run
from memagent_jax.rl.checkpointing import Checkpointer, committed_steps
from memagent_jax.rl.config import (
    CONFIG_FILE,
    RESUMABLE,
    TrainConfig,
    check_devices,
    load_train_config,
)
from memagent_jax.rl.learner import Learner
from memagent_jax.rl.rows import rows_from_trajectories
from memagent_jax.rl.scoring import Rewarder
from memagent_jax.rl.steps import StepInputs
from memagent_jax.rl.tensorboard import ScalarWriter
from memagent_jax.rl.trained import rollout_records
from memagent_jax.rollout.runner import build_runner
from memagent_jax.runconfig import check, differences, to_dict, write_config


def no_update_line(step: int, record: dict, timeout_s: float | None, tries: int) -> str:
    """Why step `step` trained nothing, from its record (the counts of every try's
    rollouts): all of them past their deadline, or every group's rewards equal."""
    late = record.get("rollout/timed_out", 0.0)
    if late and late == record.get("rollout/trajectories"):
        return f"step {step}: every rollout passed rollout.timeout_s = {timeout_s:g} s: no update"
    return f"step {step}: every group's rewards were equal after {tries} tries: no update"

class Trainer:
    """Sets up from a TrainConfig; `run()` trains to config.steps (resuming from the newest
    checkpoint when there is one) and returns the last step's record."""

    def __init__(self, config: TrainConfig):
        check(config)
        self.config = config
        run = build_run(config)           # the agent and plugin it names (no device)
        self.agent, self.plugin = run.agent, run.plugin
        startup.start(startup.Launch(auto=config.distributed))
        if config.compilation_cache_dir:
            jax.config.update("jax_compilation_cache_dir", config.compilation_cache_dir)
            # Cache everything: the many small programs (prefill buckets, micro-batch shapes)
            # are what a restart would otherwise spend its first minutes compiling.
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        self.process_index, self.process_count = jax.process_index(), jax.process_count()
        self.is_main = self.process_index == 0
        self._check_inputs()              # files: data, model, tokenizer (no device work)
        self.mesh_axes = check_devices(config, jax.device_count())
        self._keep_config()               # config.yaml; a resume's changes checked
        self._announce()
        self._build()                     # devices from here on
        self.step = 0
        self.rng = jax.random.key(config.seed)
        self._bar = None
        self._stop_line: str | None = None
        self._restore_if_any()

    # ---- setup --------------------------------------------------------------------------

    def _check_inputs(self) -> None:
        """Reads the data sources and the tokenizer, and checks that the output directories
        can be made: every file the run needs, and every optional package; no device."""
        data = self.config.data
        fields = tuple(getattr(self.agent, "required_fields", ()))
        sources = [pipeline.load_source(s, data.train_split, key=f"data.train[{i}]",
                                        required=fields) for i, s in enumerate(data.train)]
        self.train_data = pipeline.concatenate(sources)
        if self.config.prompts_per_step > len(self.train_data):
            # A step would draw rows again and again (10^6 of 64 rows: minutes of building
            # examples before the first line, and of rollouts no signal stops soon).
            raise ConfigError("prompts_per_step", f"{self.config.prompts_per_step} is more "
                                                  f"than the {len(self.train_data)} rows of "
                                                  f"data.train ({', '.join(data.train)}): a "
                                                  "step's prompts would repeat rows")
        self.val_examples = []
        if data.val:
            val = pipeline.load_source(data.val, data.val_split, key="data.val", required=fields)
            self.val_examples = pipeline.evaluation_examples(val, self.config.validation.size)
        self.tokenizer = self.config.model.load_tokenizer(required=True)
        # The example iterator's and the ScalarWriter's, imported once the model has loaded:
        # a missing one fails here, not after minutes of loading.
        with needs("train", "train"):
            import grain  # noqa: F401
            import tensorboard  # noqa: F401
        for key, path in (("output_dir", self.config.output_dir),
                          ("log_dir", self.config.logs_dir),
                          ("checkpoint.dir", self.config.checkpoint_dir)):
            if "://" not in path:  # gs:// and the like are not local paths
                check_output_dir(path, key)

    def _keep_config(self) -> None:
        """Keeps the resolved config in output_dir/config.yaml (process 0), a file that
        `train --config` reruns as it is. Where the run resumes from a checkpoint, the config
        it was started with must be this one but for the keys in RESUMABLE (rl/config.py): a
        run with other settings would mix two runs in one set of checkpoints and logs, so
        each other change is named, old and new value, and the run refused."""
        config = self.config
        path = os.path.join(config.output_dir, CONFIG_FILE)

        def keep() -> None:
            if os.path.exists(path) and committed_steps(config.checkpoint_dir):
                changed = differences(to_dict(load_train_config(path)), to_dict(config),
                                      RESUMABLE)
                if changed:
                    raise UserError(
                        f"{config.output_dir}: resuming a run started with other settings "
                        f"({'; '.join(changed)}); rerun with the settings of {path}, or give "
                        f"another output_dir (a resume may change only {', '.join(RESUMABLE)})")
            write_config(config, path, "The resolved config of this run, written by "
                                       "`memagent-jax train` at its start.\n`memagent-jax "
                                       f"train --config {path}` resumes it.")

        collectives.on_main(keep)

    def _announce(self) -> None:
        """What the run is about to do, before the model loads (process 0)."""
        c, m, agent = self.config, self.config.model, self.agent
        data = f"{', '.join(c.data.train)} ({len(self.train_data)} rows)"
        if c.data.val:
            data += f"; validation {c.data.val} ({len(self.val_examples)} rows used)"
        mesh = " x ".join(f"{axis} {size}" for axis, size in self.mesh_axes.items())
        announce("train", {
            "model": m.path or f"preset {m.preset}, random weights (init_seed {m.init_seed})",
            "data": data,
            "devices": f"{jax.device_count()} {jax.default_backend()} device(s) in "
                       f"{self.process_count} process(es), mesh {mesh}",
            "agent": (f"{agent.name}: {agent.describe()}" if hasattr(agent, "describe")
                      else agent.name) + f"; {c.engine.slots} decode slots",
            "steps": f"{c.steps} ({c.learner.loss}), each {c.prompts_per_step} prompts x "
                     f"{c.rollout.n} trajectories",
            "run dir": f"{c.output_dir} ({CONFIG_FILE}; checkpoints {c.checkpoint_dir}, "
                       f"logs {c.logs_dir})"})

    def _build(self) -> None:
        config = self.config
        self.mesh = make_mesh(self.mesh_axes, source="mesh")
        collectives.check_shared_directory(config.checkpoint_dir, "checkpoint directory")
        loaded = load_model_section(config.model, self.tokenizer, self.mesh)
        self.learner = Learner(loaded.model, config.learner, mesh=self.mesh, seed=config.seed)
        # Under LoRA a checkpoint holds adapters only: the base they train on goes beside
        # them (in each step's meta and the model files' lora.json), and a resume on other
        # weights is refused (`_restore_if_any`).
        self.base_record = None if self.learner.base is None else self._base_record(loaded)
        self._write_model_files(loaded.config)
        self.runner = build_runner(self.agent, loaded.model, self.tokenizer, config.engine,
                                   self.mesh, loaded.stop_ids)
        self.rewarder = Rewarder(config.reward)
        self.iterator = pipeline.training_iterator(self.train_data, config.seed,
                                                   shuffle=config.data.shuffle)
        self.checkpointer = Checkpointer(config.checkpoint_dir, keep=config.checkpoint.keep,
                                         async_save=config.checkpoint.async_save)
        self.writer = ScalarWriter(os.path.join(config.logs_dir, "tensorboard"),
                                   self.process_index)
        self.preemption = PreemptionNotice(
            on_interrupt="Ctrl-C: stopping at the next turn or step boundary, then "
                         "checkpointing the last finished step (Ctrl-C again changes nothing; "
                         "kill -9 stops at once and keeps only the newest checkpoint)")

    def _base_record(self, loaded) -> dict:
        """What a LoRA run's adapters are trained on: the base as the model section names it
        (with the PEFT adapter merged onto it, if any; paths absolute), its stored dtype and
        fingerprint, and the adapters' shape."""
        m, lora = self.config.model, self.config.learner.lora
        assert lora is not None and self.learner.base is not None

        def absolute(path):  # the run's files are read from any directory (export, serve)
            return path if path is None or "://" in path else os.path.abspath(
                model_dir.resolve(path))

        return {"path": absolute(m.path), "preset": m.preset, "init_seed": m.init_seed,
                "merged_adapter": absolute(m.lora), "dtype": loaded.config.dtype,
                "fingerprint": weights_fingerprint(self.learner.base),
                "rank": lora.rank, "alpha": lora.alpha, "targets": list(lora.targets)}

    def _write_model_files(self, model_config) -> None:
        """The model and tokenizer the run trains, beside its checkpoints, so that a step
        directory loads as a model (`export`, `run`, `eval`, `generate`), and the agent's own
        files (`model_files()`; MemAgent's memagent.json: the budgets and `thinking` setting
        it trains with, which `run` and `demo` default to). Written once."""
        directory = os.path.join(self.config.checkpoint_dir, model_dir.TRAINING_MODEL_DIR)
        if "://" in directory or collectives.broadcast(os.path.isdir(directory)):
            return
        m = self.config.model
        sources = [m.tokenizer, m.path, m.path and model_dir.side_files_dir(m.path)]
        files = self.agent.model_files() if hasattr(self.agent, "model_files") else {}
        checkpoint.write_model_files(model_config, directory, [d for d in sources if d], files,
                                     lora=self.base_record)

    def _restore_if_any(self) -> None:
        latest = self.checkpointer.latest_step()
        if latest is not None:
            state, meta = self.checkpointer.restore(self.learner.state(), self.iterator, latest)
            self._check_base(meta, latest)
            self.learner.restore(state)
            self.rng = jax.random.wrap_key_data(jnp.asarray(meta["rng"], jnp.uint32))
            self.step = int(meta["step"])
            self._say(f"resuming from step {self.step} ({self.config.checkpoint_dir}/"
                      f"{latest})")
        self._reset_step_log()
        if latest is not None:
            self.writer.start_session(self.step + 1)

    def _check_base(self, meta: dict, step: int) -> None:
        """A LoRA checkpoint resumes only on the base its adapters were trained on."""
        saved, now = meta.get("base"), self.base_record
        if (saved or now) and (saved or {}).get("fingerprint") != (now or {}).get("fingerprint"):
            what = (f"LoRA adapters trained on {base_name(saved)} (weights "
                    f"{saved['fingerprint']})" if saved else "full-parameter weights")
            ours = (f"LoRA on {base_name(now)} (weights {now['fingerprint']})" if now
                    else "full-parameter training")
            raise UserError(f"{self.config.checkpoint_dir}/{step}: holds {what}; this run is "
                            f"{ours}: resume on the base the run started from, or give "
                            "another output_dir")

    # ---- the loop -----------------------------------------------------------------------

    def run(self) -> dict:
        """Trains to `config.steps`; returns the last step's record ({} where no step ran).
        Raises Interrupted (after the checkpoint, `stop`) where a signal stopped it first."""
        config = self.config
        record: dict = {}
        if self.step >= config.steps:
            self._say(f"already at step {self.step} of {config.steps}: nothing to do")
        # SIGTERM and Ctrl-C alike only ask for a stop (`stop`) from here until the last
        # checkpoint has committed (close), so neither cuts a step or a write short. A step
        # that fails closes too: the checkpoints before it have committed when it reports.
        with self.preemption, contextlib.closing(self):
            if config.validation.at_start and self.step == 0:
                self._log(0, self.validate(0))
            with progress_bar(total=config.steps, initial=self.step, desc="train",
                              unit="step", disable=not self.is_main) as bar:
                self._bar = bar
                while self.step < config.steps and not self.stopped:
                    record = self.train_step(self.step + 1) or record
                    bar.update(0 if self.stopped else 1)
                    if (self.step < config.steps and not self.stopped
                            and self.preemption.reached()):
                        self.stop(self.step)
        if self._stop_line is not None:  # self.stopped
            raise Interrupted(self._stop_line, self.preemption.signal_number)
        if record:
            summary = [f"reward {record['reward/mean']:.3f}"] + (
                [f"val accuracy {record['val/accuracy']:.1f}"] if "val/accuracy" in record
                else [])
            self._say(f"finished step {self.step} of {config.steps} ({', '.join(summary)}); "
                      f"checkpoints in {config.checkpoint_dir}, TensorBoard logs in "
                      f"{os.path.join(config.logs_dir, 'tensorboard')}")
        return record

    def train_step(self, step: int) -> dict:
        """Runs step `step` (self.step + 1): rollouts, update, validation, checkpoint, logs.
        A SIGTERM or Ctrl-C during the rollouts (checked after every turn) stops the run at
        the previous step instead (`stopped`), checkpointed as it was when this step began."""
        config, start = self.config, time.perf_counter()
        calls = [0]
        at_start = self.rng, self.iterator.get_state()

        def on_call(_row):
            calls[0] += 1
            if calls[0] % 16 == 0 and self._bar is not None:
                self._bar.set_postfix_str(f"step {step}: {calls[0]} replies", refresh=True)
            if self.preemption.reached():  # every process finishes the same replies in order
                raise _Preempted

        seeds = []

        def seed_for_try(_try):
            seeds.append(self._seed_for_try(_try))
            return seeds[-1]

        # Seeds the rows a step makes itself (a plugin's): a function of the step alone,
        # so that a resumed run makes the same ones. Its reads sample as the step's own, and
        # a stop ends them too (on_call).
        params = self.learner.params  # under LoRA a merged copy: made once a step
        context = plugin.StepContext(
            self.agent, config.seed * 1_000_003 + step, self.learner.logprobs,
            self.runner.with_params(params, fixed_sampling=True), on_call)
        inputs = StepInputs(config, self.runner, self.rewarder, self.plugin, params,
                            self.iterator, context, seed_for_try, on_call,
                            functools.partial(self.compute_advantages, step))
        try:
            batch = self.learner.kind.collect(inputs)
        except _Preempted:
            self.rng = at_start[0]
            self.iterator.set_state(at_start[1])
            self.stop(step - 1)
            return {}
        collectives.check_same(f"step {step}'s drawn examples, sampling seeds and kept examples",
                               (batch.drawn, seeds, [e.index for e in batch.examples]))
        record = {"step": step, "examples": batch.drawn,
                  "kept": [e.index for e in batch.examples], **batch.stats}
        if batch.groups and not all(t.timed_out for g in batch.groups for t in g):
            groups, advantages = self.learner.kind.groups(batch, inputs)
            rows = rows_from_trajectories(groups, advantages)
            if config.log.rollouts_every and step % config.log.rollouts_every == 0:
                self._log_rollouts(rollout_records(step, groups, batch.rewards, advantages,
                                                   config.log.rollouts))
            update_start = time.perf_counter()
            metrics = self.learner.update(rows)
            update_time = time.perf_counter() - update_start
            record.update({f"learner/{k}": v for k, v in metrics.items()})
            record.update({"time/update_s": update_time, "learner/rows": float(len(rows)),
                           "learner/tokens_per_s": metrics["tokens"] / update_time})
            if metrics["skipped_updates"]:
                self._say(f"step {step}: {int(metrics['skipped_updates'])} update(s) skipped: "
                          "non-finite loss or gradient; parameters left unchanged")
        else:
            self._say(no_update_line(step, record, config.rollout.timeout_s, batch.tries))
            record.update({"learner/updates": 0.0, "learner/skipped_updates": 0.0})
        self.step = step
        if config.validation.every and step % config.validation.every == 0:
            record.update(self.validate(step))
        record["time/step_s"] = time.perf_counter() - start
        if config.checkpoint.every and step % config.checkpoint.every == 0 or step == config.steps:
            self.save(step)
        self._log(step, record)
        self._announce_kept()
        return record

    def compute_advantages(self, step: int, rewards: np.ndarray) -> np.ndarray:
        """[G, n] rewards -> [G, n] advantages (reward minus its group's mean; divided by the
        group's std with learner.normalize_std). A subclass may override it."""
        return group_advantages(rewards, normalize_std=self.config.learner.normalize_std)

    def validate(self, step: int) -> dict[str, float]:
        """Lenient metrics (docs/algorithm.md section 2) of the validation set's final answers,
        means over its `validation.n` samples per question: val/accuracy = mean sub-EM x 100
        (the published figure), exact match, F1, the mean training reward (data.reward's
        verifier), and the plugin's own metrics of the read (`val/NAME`)."""
        v, start = self.config.validation, time.perf_counter()
        sampling = SamplingParams(v.temperature, v.top_p, seed=self.config.seed + 1)
        groups = self.runner.with_params(self.learner.params).run(
            self.agent, self.val_examples, sampling, n=v.n)
        scores = [qa_scores(t.answer, list(e.ground_truths))
                  for e, g in zip(self.val_examples, groups) for t in g]
        rewards, _ = self.rewarder.score(self.val_examples, groups)
        extra = (self.plugin.validation_metrics(self.agent, self.val_examples, groups)
                 if self.plugin else {})
        return {"val/accuracy": 100 * float(np.mean([s["sub_em"] for s in scores])),
                "val/exact_match": float(np.mean([s["em"] for s in scores])),
                "val/f1": float(np.mean([s["f1"] for s in scores])),
                "val/reward": float(rewards.mean()),
                **{f"val/{name}": value for name, value in extra.items()},
                "time/validation_s": time.perf_counter() - start}

    def save(self, step: int) -> None:
        """Checkpoints the step, never non-finite parameters (a skipped NaN update leaves
        the previous parameters, so this only fires on a learner bug)."""
        state = self.learner.state()
        if not bool(jax.jit(_all_finite)(state["params"])):
            raise RuntimeError(f"step {step}: non-finite parameters; not checkpointed")
        meta = {"step": step, "rng": np.asarray(jax.random.key_data(self.rng)).tolist(),
                "learner_step": self.learner.step}
        if self.base_record is not None:
            meta["base"] = self.base_record
        self.checkpointer.save(step, state, meta, self.iterator)

    def _announce_kept(self) -> None:
        """A line for each checkpoint that has committed since the last: announced when it is
        kept, not when its save starts (an async save may still fail, on a full disk)."""
        for step in self.checkpointer.newly_kept():
            self._say(f"step {step}: checkpoint kept in {self.config.checkpoint_dir}/{step}")

    @property
    def stopped(self) -> bool:
        """Whether a SIGTERM or Ctrl-C stopped the run (see `stop`)."""
        return self._stop_line is not None

    def stop(self, step: int) -> None:
        """Stops for a SIGTERM or Ctrl-C (`self.preemption`) after step `step`, the last one
        whose line was printed: its checkpoint is written (unless it already is) and committed
        before this returns; `run` then reports it in one line."""
        if step and self.checkpointer.latest_step() != step:
            self.save(step)
        self.checkpointer.wait()
        where = (f"step {step} is checkpointed in {self.config.checkpoint_dir}" if step
                 else "no step was completed")
        cause = ("interrupted (Ctrl-C)" if self.preemption.interrupted
                 else "stopped by a preemption notice (SIGTERM)")
        self._stop_line = f"{cause} after step {step}: {where}; run the same command to resume"

    def close(self) -> None:
        self.checkpointer.close()
        self._announce_kept()
        self.writer.close()
        self.rewarder.close()

    # ---- helpers ------------------------------------------------------------------------

    def _seed_for_try(self, _try: int) -> int:
        """A fresh rollout seed from the run's RNG key (split once per rollout round)."""
        self.rng, key = jax.random.split(self.rng)
        return int(jax.random.randint(key, (), 0, 2**31 - 1))

    def _reset_step_log(self) -> None:
        """steps.jsonl and rollouts.jsonl keep the records up to the step the run (re)starts
        from: a killed run may have logged steps past its last checkpoint, which the resumed
        run logs again."""
        self._step_log = os.path.join(self.config.logs_dir, "steps.jsonl")
        self._rollout_log = os.path.join(self.config.logs_dir, "rollouts.jsonl")
        if not self.is_main:
            return
        os.makedirs(self.config.logs_dir, exist_ok=True)
        for path in (self._step_log, self._rollout_log):
            kept = []
            if self.step and os.path.exists(path):
                with open(path) as f:
                    kept = [line for line in f if line.strip()
                            and json.loads(line).get("step", 0) <= self.step]
            with open(path, "w") as f:
                f.writelines(kept)

    def _log_rollouts(self, records: list[dict]) -> None:
        """A step's rollouts as trained, one JSON line each (`config.log`)."""
        if self.is_main:
            with open(self._rollout_log, "a") as f:
                f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)

    def _log(self, step: int, record: dict) -> None:
        if not self.is_main:
            return
        self.writer.scalars(step, {k: v for k, v in record.items()
                                   if isinstance(v, (int, float)) and k != "step"})
        self.writer.flush()
        with open(self._step_log, "a") as f:
            f.write(json.dumps(record, default=float) + "\n")
        if not step:  # validation.at_start: before any update
            self._say(f"step 0/{self.config.steps} (before training): "
                      f"val {record['val/accuracy']:.1f}, val reward {record['val/reward']:.3f}, "
                      f"{record['time/validation_s']:.1f}s")
        else:
            parts = [f"reward {record['reward/mean']:.3f}+-{record['reward/std']:.3f}"]
            if "dynamic/kept_fraction" in record:  # not in a supervised step
                parts.append(f"kept {record['dynamic/kept_fraction']:.2f}")
            if "learner/loss" in record and math.isfinite(record["learner/loss"]):
                parts.append(f"loss {record['learner/loss']:.4g}")
            if "val/accuracy" in record:
                parts.append(f"val {record['val/accuracy']:.1f}")
            parts.append(f"{record['time/step_s']:.1f}s")
            self._say(f"step {step}/{self.config.steps}: " + ", ".join(parts))

    def _say(self, line: str) -> None:
        if self.is_main:
            tqdm.write(line, file=sys.stderr)


class _Preempted(Exception):
    """A SIGTERM or Ctrl-C in the middle of a step's rollouts."""


def _all_finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def train(config: TrainConfig) -> dict:
    """Builds a Trainer and runs it; returns the last step's record. A full disk is one line
    naming output_dir (the checkpointer names its own directory)."""
    try:
        return Trainer(config).run()
    except Exception as e:
        if isinstance(e, UserError) or not is_disk_full(e):
            raise
        raise disk_full_error(config.output_dir, "free some space and run the same command to "
                                                 "resume from the newest checkpoint") from None
