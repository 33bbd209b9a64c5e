"""The RL training loop: `memagent-jax train --config FILE key=value ...`.

Per step: draw prompts (grain iterator) -> n MemoryAgent trajectories per prompt on the decoding
engine -> rewards, overlong shaping, dynamic sampling (collect.py) -> group advantages ->
training rows (one per conversation) -> `Learner.update` (PPO mini-batches) ->
`Engine.update_params` (the same arrays, the same mesh) -> periodic validation with the lenient
metrics -> Orbax checkpoint -> TensorBoard scalars and one JSON line per step.

Everything a step depends on is in the checkpoint (parameters, optimiser state, step, the RNG
key that seeds the rollouts, the data iterator's position), and the learner's own shuffling is
seeded by (seed, optimiser step), so a run killed at any point and resumed from its last
checkpoint repeats exactly what the uninterrupted run does: same examples, same samples, same
parameters. `logs/steps.jsonl` records each step's drawn example indices to show it.

Setup checks every input (config, data sources, model and tokenizer directories, the mesh
against the devices) before a model is loaded or anything is compiled. Only process 0 writes
logs; every process drives the same global batch through the SPMD engine and learner.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time

import jax
import numpy as np
from tqdm import tqdm

from memagent_jax.errors import UserError
from memagent_jax.rl.config import TrainConfig, check_devices, validate


class Trainer:
    """Sets up from a validated TrainConfig; `run()` trains to config.steps (resuming from the
    newest checkpoint when there is one) and returns the last step's record."""

    def __init__(self, config: TrainConfig):
        validate(config)
        self.config = config
        if config.distributed:
            jax.distributed.initialize()
        if config.compilation_cache_dir:
            jax.config.update("jax_compilation_cache_dir", config.compilation_cache_dir)
            # Cache everything: the many small programs (prefill buckets, micro-batch shapes)
            # are what a restart would otherwise spend its first minutes compiling.
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        self.process_index, self.process_count = jax.process_index(), jax.process_count()
        self.is_main = self.process_index == 0
        self._check_inputs()              # files: data, model, tokenizer (no device work)
        self.mesh_axes = check_devices(config, jax.device_count(), self.process_count)
        self._build()                     # devices from here on
        self.step = 0
        self.rng = jax.random.key(config.seed)
        self._bar = None
        self._restore_if_any()

    # ---- setup --------------------------------------------------------------------------

    def _check_inputs(self) -> None:
        from memagent_jax.data import pipeline
        from memagent_jax.models import preset_config
        from memagent_jax.tokenizer import load_tokenizer

        config = self.config
        sources = [pipeline.load_source(s, config.data.train_split, key=f"data.train[{i}]")
                   for i, s in enumerate(config.data.train)]
        if len(sources) > 1:
            import datasets
            self.train_data = datasets.concatenate_datasets(sources)
        else:
            self.train_data = sources[0]
        self.val_examples = []
        if config.data.val:
            val = pipeline.load_source(config.data.val, config.data.val_split, key="data.val")
            self.val_examples = pipeline.evaluation_examples(val, config.validation.size)
        model = config.model
        if model.path is not None and not os.path.isdir(model.path):
            raise UserError(f"model.path: '{model.path}': model directory not found")
        if model.preset is not None:
            preset_config(model.preset)  # an unknown preset name fails here
        tokenizer_dir = model.tokenizer or model.path
        self.tokenizer = load_tokenizer(tokenizer_dir) if os.path.isdir(tokenizer_dir) else None
        if self.tokenizer is None:
            raise UserError(f"model.tokenizer: '{tokenizer_dir}' has no tokenizer files "
                            "(tokenizer.json / tokenizer_config.json)")
        if config.learner.temperature != config.rollout.temperature:
            raise UserError(f"learner.temperature ({config.learner.temperature}) must equal "
                            f"rollout.temperature ({config.rollout.temperature}): the learner "
                            "scores tokens under the distribution they were sampled from")

    def _build(self) -> None:
        from memagent_jax.data.pipeline import training_iterator
        from memagent_jax.models import make_mesh
        from memagent_jax.rl.checkpointing import Checkpointer
        from memagent_jax.rl.learner import Learner
        from memagent_jax.rl.tensorboard import ScalarWriter
        from memagent_jax.rollout.engine import Engine, EngineConfig
        from memagent_jax.rollout.memagent import MemAgentConfig, MemoryAgent, required_length
        from memagent_jax.rollout.scheduler import Scheduler

        config, rollout = self.config, self.config.rollout
        self.mesh = make_mesh(self.mesh_axes, source="mesh")
        model, model_config = self._load_model()
        if len(self.tokenizer) > model_config.vocab_size:
            raise UserError(f"model.tokenizer: {len(self.tokenizer)} tokens do not fit the "
                            f"model's {model_config.vocab_size} embedding rows")
        agent_config = MemAgentConfig(rollout.chunk_tokens, rollout.max_memory_tokens,
                                      rollout.max_final_tokens, rollout.max_problem_tokens,
                                      rollout.max_chunks)
        needed = required_length(self.tokenizer, rollout.max_problem_tokens, agent_config)
        max_len = rollout.max_len or -(-needed // 256) * 256
        self.learner = Learner(model, config.learner, mesh=self.mesh)
        self.engine = Engine(self.learner.model, EngineConfig(
            slots=rollout.slots, max_len=max_len,
            prefill_buckets=tuple(rollout.prefill_buckets) if rollout.prefill_buckets else None,
            prefill_rows=rollout.prefill_rows), mesh=self.mesh)
        scheduler = Scheduler(self.engine)
        stops = self._stop_ids(model_config)
        self.agent = MemoryAgent(scheduler, self.tokenizer, agent_config, stops)
        # Validation reads whole documents: accuracy at length is what it measures.
        self.val_agent = MemoryAgent(scheduler, self.tokenizer,
                                     dataclasses.replace(agent_config, max_chunks=None), stops)
        self.iterator = training_iterator(self.train_data, config.seed, self.process_index,
                                          self.process_count)
        self.checkpointer = Checkpointer(config.checkpoint_dir, keep=config.checkpoint.keep,
                                         async_save=config.checkpoint.async_save)
        self.writer = ScalarWriter(os.path.join(config.logs_dir, "tensorboard"),
                                   self.process_index)

    def _load_model(self):
        from memagent_jax.models import build_model, load_model, param_shardings, preset_config
        from memagent_jax.models.loading import model_params, nest, random_model

        from memagent_jax.rollout.local import default_dtype

        m = self.config.model
        dtype = m.dtype or default_dtype()
        if m.path is not None:
            return load_model(m.path, dtype=dtype, mesh=self.mesh, attention=m.attention)
        config = preset_config(m.preset, dtype=dtype)
        shardings = param_shardings(config, self.mesh)
        params = {path: jax.device_put(array, shardings[path]) for path, array in
                  model_params(random_model(config, seed=m.init_seed, dtype=dtype)).items()}
        return build_model(config, nest(params), dtype=dtype, attention=m.attention), config

    def _stop_ids(self, model_config) -> tuple[int, ...]:
        from memagent_jax.tokenizer import stop_token_ids

        m = self.config.model
        stops = stop_token_ids(m.path, model_config) if m.path else ()
        if not stops and self.tokenizer.eos_token_id is not None:
            stops = (int(self.tokenizer.eos_token_id),)
        return stops

    def _restore_if_any(self) -> None:
        latest = self.checkpointer.latest_step()
        if latest is not None:
            state, meta = self.checkpointer.restore(self.learner.state(), self.iterator, latest)
            self.learner.restore(state)
            self.engine.update_params(self.learner.params)
            self.rng = jax.random.wrap_key_data(np.asarray(meta["rng"], np.uint32))
            self.step = int(meta["step"])
        self._reset_step_log()
        if latest is not None:
            self.writer.start_session(self.step + 1)

    # ---- the loop -----------------------------------------------------------------------

    def run(self) -> dict:
        config = self.config
        record: dict = {}
        if self.step >= config.steps:
            self._say(f"already at step {self.step} of {config.steps}: nothing to do")
        if config.validation.at_start and self.step == 0:
            self._log(0, self.validate(0))
        with tqdm(total=config.steps, initial=self.step, desc="train", unit="step",
                  file=sys.stderr, disable=not self.is_main, dynamic_ncols=True) as bar:
            self._bar = bar
            while self.step < config.steps:
                record = self.train_step(self.step + 1)
                bar.update(1)
        self.close()
        return record

    def train_step(self, step: int) -> dict:
        """Runs step `step` (self.step + 1): rollouts, update, validation, checkpoint, logs."""
        from memagent_jax.rl.collect import collect_batch
        from memagent_jax.rl.rows import rows_from_trajectories

        config, start = self.config, time.perf_counter()
        turns = [0]

        def on_turn(_sample, _conversation):
            turns[0] += 1
            if turns[0] % 16 == 0 and self._bar is not None:
                self._bar.set_postfix_str(f"step {step}: {turns[0]} turns", refresh=True)

        batch = collect_batch(self.agent, self.iterator, config, self._seed_for_try,
                              self._gather, self.process_count, on_turn)
        record = {"step": step, "examples": batch.drawn,
                  "kept": [e.index for e in batch.examples], **batch.stats}
        if batch.groups:
            advantages = self.compute_advantages(step, batch.rewards)
            rows = rows_from_trajectories(batch.groups, advantages)
            update_start = time.perf_counter()
            metrics = self.learner.update(rows)
            self.engine.update_params(self.learner.params)
            update_time = time.perf_counter() - update_start
            record.update({f"learner/{k}": v for k, v in metrics.items()})
            record.update({"time/update_s": update_time, "learner/rows": float(len(rows)),
                           "learner/tokens_per_s": metrics["tokens"] / update_time})
            if metrics["skipped_updates"]:
                self._say(f"step {step}: {int(metrics['skipped_updates'])} update(s) skipped: "
                          "non-finite loss or gradient; parameters left unchanged")
        else:
            self._say(f"step {step}: every group's rewards were equal after "
                      f"{batch.tries} tries: no update")
            record.update({"learner/updates": 0.0, "learner/skipped_updates": 0.0})
        self.step = step
        if config.validation.every and step % config.validation.every == 0:
            record.update(self.validate(step))
        record["time/step_s"] = time.perf_counter() - start
        if config.checkpoint.every and step % config.checkpoint.every == 0 or step == config.steps:
            self.save(step)
        self._log(step, record)
        return record

    def compute_advantages(self, step: int, rewards: np.ndarray) -> np.ndarray:
        """[G, n] rewards -> [G, n] advantages (reward minus its group's mean; divided by the
        group's std with learner.normalize_std). A subclass may override it."""
        from memagent_jax.rl.advantages import group_advantages
        return group_advantages(rewards, normalize_std=self.config.learner.normalize_std)

    def validate(self, step: int) -> dict[str, float]:
        """Lenient metrics (REFERENCE.md section 2) of the validation set's final answers:
        val/accuracy = mean sub-EM x 100 (the published figure), exact match, F1, and the mean
        training reward (data.reward's verifier)."""
        from memagent_jax.eval.metrics import qa_scores
        from memagent_jax.rl.collect import score
        from memagent_jax.rollout.sampling import SamplingParams

        v, start = self.config.validation, time.perf_counter()
        sampling = SamplingParams(v.temperature, v.top_p)
        groups = self.val_agent.run([(e.question, e.context) for e in self.val_examples],
                                    sampling, n=1, seed=self.config.seed + 1)
        scores = [qa_scores(g[0].answer, list(e.ground_truths))
                  for e, g in zip(self.val_examples, groups)]
        rewards = score(self.val_examples, groups, self.config.data.reward)
        return {"val/accuracy": 100 * float(np.mean([s["sub_em"] for s in scores])),
                "val/exact_match": float(np.mean([s["em"] for s in scores])),
                "val/f1": float(np.mean([s["f1"] for s in scores])),
                "val/reward": float(rewards.mean()),
                "time/validation_s": time.perf_counter() - start}

    def save(self, step: int) -> None:
        """Checkpoints the step, never non-finite parameters (a skipped NaN update leaves
        the previous parameters, so this only fires on a learner bug)."""
        state = self.learner.state()
        if not bool(jax.jit(_all_finite)(state["params"])):
            raise RuntimeError(f"step {step}: non-finite parameters; not checkpointed")
        meta = {"step": step, "rng": np.asarray(jax.random.key_data(self.rng)).tolist(),
                "learner_step": self.learner.step}
        self.checkpointer.save(step, state, meta, self.iterator)
        self._say(f"step {step}: checkpoint -> {self.config.checkpoint_dir}/{step}")

    def close(self) -> None:
        self.checkpointer.close()
        self.writer.close()

    # ---- helpers ------------------------------------------------------------------------

    def _seed_for_try(self, _try: int) -> int:
        """A fresh rollout seed from the run's RNG key (split once per rollout round)."""
        self.rng, key = jax.random.split(self.rng)
        return int(jax.random.randint(key, (), 0, 2**31 - 1))

    def _gather(self, local: list) -> list:
        """Every process's drawn examples, in process order (identity on one process)."""
        if self.process_count == 1:
            return local
        import pickle

        from jax.experimental import multihost_utils
        data = np.frombuffer(pickle.dumps(local), np.uint8)
        sizes = multihost_utils.process_allgather(np.array([data.size]))
        padded = np.zeros(int(sizes.max()), np.uint8)
        padded[:data.size] = data
        everything = multihost_utils.process_allgather(padded)
        return [e for p in range(self.process_count)
                for e in pickle.loads(everything[p, :int(sizes[p, 0])].tobytes())]

    def _reset_step_log(self) -> None:
        """steps.jsonl keeps the records up to the step the run (re)starts from: a killed run
        may have logged steps past its last checkpoint, which the resumed run logs again."""
        self._step_log = os.path.join(self.config.logs_dir, "steps.jsonl")
        if not self.is_main:
            return
        os.makedirs(self.config.logs_dir, exist_ok=True)
        kept = []
        if self.step and os.path.exists(self._step_log):
            with open(self._step_log) as f:
                kept = [line for line in f if line.strip()
                        and json.loads(line).get("step", 0) <= self.step]
        with open(self._step_log, "w") as f:
            f.writelines(kept)

    def _log(self, step: int, record: dict) -> None:
        if not self.is_main:
            return
        self.writer.scalars(step, {k: v for k, v in record.items()
                                   if isinstance(v, (int, float)) and k != "step"})
        self.writer.flush()
        with open(self._step_log, "a") as f:
            f.write(json.dumps(record, default=float) + "\n")
        if step:
            parts = [f"reward {record['reward/mean']:.3f}+-{record['reward/std']:.3f}",
                     f"kept {record['dynamic/kept_fraction']:.2f}"]
            if "learner/loss" in record and math.isfinite(record["learner/loss"]):
                parts.append(f"loss {record['learner/loss']:.4g}")
            if "val/accuracy" in record:
                parts.append(f"val {record['val/accuracy']:.1f}")
            parts.append(f"{record['time/step_s']:.1f}s")
            self._say(f"step {step}/{self.config.steps}: " + ", ".join(parts))

    def _say(self, line: str) -> None:
        if self.is_main:
            tqdm.write(line, file=sys.stderr)


def _all_finite(tree) -> jax.Array:
    import jax.numpy as jnp
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def train(config: TrainConfig) -> dict:
    """Builds a Trainer and runs it; returns the last step's record."""
    return Trainer(config).run()
