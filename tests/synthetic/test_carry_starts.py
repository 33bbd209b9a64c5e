"""Carry starts (synthetic/carry_starts.py): rollouts that begin inside a long document with the
question's facts in the memory, over the filler chunks the current model finds hardest to keep
it through; checked against the synthetic documents' own facts and the original's verifier, and
run through the agent. With `carry_from: policy` the memory is the one the policy wrote itself:
checked with a policy whose memories are known, through the engine with a random model, and
as a DAPO step of the trainer."""

import dataclasses
import json
import os
import re

import numpy as np
import pytest

from memagent_jax.agents.memagent.agent import memories_of
from memagent_jax.agents.memagent.templates import TokenPrompts
from memagent_jax.cli import main
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.rl.config import load_train_config
from memagent_jax.rl.rewards import strict_reward
from memagent_jax.rl.trainer import Trainer
from memagent_jax.rollout.agent_api import Trajectory
from memagent_jax.synthetic import carry_starts as starts_module
from memagent_jax.synthetic import tasks as synthetic
from memagent_jax.synthetic.carry_starts import carry_starts, policy_carry_starts
from memagent_jax.synthetic.oracle import update_turn
from memagent_jax.tokenizer import word_ids

pytestmark = pytest.mark.slow  # DAPO steps

FACT_WORDS = ("code", "city")


class _Rollouts:
    """`Rollouts` of one trajectory a row, `read(rows, sampling)`'s."""

    def __init__(self, read):
        self.read = read

    def run(self, agent, rows, sampling, n=1, on_call=None, on_done=None):
        return [[trajectory] for trajectory in self.read(rows, sampling)]


def test_carry_starts_hold_the_facts_and_read_the_chunks_least_likely_kept(agent):
    tokenizer, end, seen = agent.tokenizer, agent.tokenizer.eos_token_id, []

    def logprobs(rows):  # a chunk's weakness: minus the number of times "the" occurs in it
        seen.append(len(rows))
        out = np.zeros(rows.tokens.shape, np.float32)
        the = word_ids(tokenizer, ["the"])[0]
        for i, (start, stop) in enumerate(zip(rows.prompt_lengths, rows.lengths)):
            # the reply is the memory unchanged and the end-of-text token
            assert rows.tokens[i, stop - 1] == end
            out[i, start] = -float(np.sum(rows.tokens[i, :start] == the))
        return out

    examples, samples = carry_starts(agent, 3, chunks=2, pool=4, seed=7, logprobs=logprobs)
    assert seen == [8, 8, 8]  # 2 x 4 candidates scored for each start
    assert [e.index for e in examples] == [-1, -2, -3] and {e.context for e in examples} == {""}
    tasks = set()
    for example, sample in zip(examples, samples):
        (answer,) = example.ground_truths
        tasks.add(example.data_source)
        assert sample.problem == example.question
        assert sample.problem_ids == tuple(tokenizer(example.question,
                                                     add_special_tokens=False)["input_ids"])
        memory = tokenizer.decode(list(sample.initial_memory))
        # the memory holds the answer's facts: the oracle's final reply from it is right
        assert answer in memory.replace(".", " . ").split()
        assert strict_reward(f"{memory} \\boxed{{{answer}}}", [answer]) == 1.0
        assert len(sample.chunks) == 2 and {len(c) for c in sample.chunks} == {64}
        for chunk in sample.chunks:  # filler: no fact sentence
            words = tokenizer.decode(list(chunk)).split()
            assert not any(w == "the" and words[i + 1] in FACT_WORDS and words[i + 2] == "of"
                           for i, w in enumerate(words[:-2]))
    assert tasks <= {"synthetic_multikey", "synthetic_twohop"}
    # the chosen chunks are the two with the most "the" of each start's eight candidates
    first = samples[0]
    again_examples, again = carry_starts(agent, 3, chunks=2, pool=4, seed=7, logprobs=logprobs)
    assert again == samples and again_examples == examples
    counts = [sum(t == word_ids(tokenizer, ["the"])[0] for t in chunk)
              for chunk in first.chunks]
    candidates = [tokenizer(synthetic.filler_text(64, 7, k), add_special_tokens=False)
                  ["input_ids"] for k in range(8)]
    all_counts = sorted((sum(t == word_ids(tokenizer, ["the"])[0] for t in c)
                         for c in candidates), reverse=True)
    assert sorted(counts, reverse=True) == all_counts[:2]
    assert all(tuple(c) in {tuple(x) for x in candidates} for c in first.chunks)
    other, _ = carry_starts(agent, 3, chunks=2, pool=4, seed=8, logprobs=logprobs)
    assert [e.question for e in other] != [e.question for e in examples]


def test_a_carry_start_runs_through_the_agent_from_its_memory(agent, rollouts):
    def logprobs(rows):
        return np.zeros(rows.tokens.shape, np.float32)

    _, samples = carry_starts(agent, 2, chunks=3, pool=1, seed=1, logprobs=logprobs)
    prompts = TokenPrompts(agent.tokenizer)
    groups = rollouts.run(agent, samples, SamplingParams(1.0, seed=0), n=2)
    for sample, group in zip(samples, groups):
        for trajectory in group:
            assert [t.kind for t in trajectory.turns] == ["update"] * 3 + ["final"]
            assert trajectory.turns[0].prompt_ids == prompts.update(
                sample.problem_ids, sample.initial_memory, sample.chunks[0])


def test_a_distractor_is_a_fact_of_the_needed_facts_form_about_other_words():
    w = synthetic.words()
    for fact, subjects, objects in (
            (f"the code of {w.keys[0]} {w.values[0]} .", w.keys, w.values),
            (f"the city of {w.people[0]} {w.cities[0]} .", w.people, w.cities),
            (f"the code of {w.cities[0]} {w.values[0]} .", w.cities, w.values)):
        text = synthetic.distractor_text(64, fact, 3, 0)
        words, form = text.split(), fact.split()
        assert len(words) == 64
        (at,) = [i for i in range(len(words) - 2) if words[i:i + 3] == form[:3]]
        subject, value, stop = words[at + 3:at + 6]
        assert subject in subjects and subject != form[3] and stop == "."
        assert value in objects and value != form[4]
        assert synthetic.distractor_text(64, fact, 3, 0) == text
        assert synthetic.distractor_text(64, fact, 3, 1) != text


def _asked_fact(agent, sample) -> str:
    """The fact a multikey read's question asks for, from its chunks' text."""
    key = sample.problem.split()[-2]
    text = " ".join(" ".join(agent.tokenizer.decode(list(c)) for c in sample.chunks)
                    .replace(".", " .").split())
    (value,) = set(re.findall(rf"the code of {key} (\w+) \.", text))
    return f"the code of {key} {value} ."


def _joined(agent, chunks) -> str:
    return "".join(agent.tokenizer.decode(list(c)) for c in chunks).replace(" ", "")


def test_policy_starts_begin_from_the_policys_memory_at_the_chunks_hardest_to_keep_it(agent):
    """A policy whose memories are known: after the chunk where the asked fact ends it writes
    the fact twice (the RL policy's habit), or, in every third read, a made-up value for the
    key; earlier chunks get a filler memory and the final turn a made-up answer."""
    tokenizer, end = agent.tokenizer, agent.tokenizer.eos_token_id
    initial = list(agent.prompts.initial_memory)
    the = word_ids(tokenizer, ["the"])[0]
    reads, memories, replies = [], [], []

    def rollout(samples, sampling):
        reads.append((samples, sampling))
        trajectories = []
        for i, sample in enumerate(samples):
            fact = _asked_fact(agent, sample)
            written = (f"{fact} {fact}" if i % 3 != 1
                       else " ".join(fact.split()[:4] + [synthetic.words().values[0], "."]))
            memory = tokenizer(written, add_special_tokens=False)["input_ids"]
            memories.append(memory)
            junk = tokenizer("the code of", add_special_tokens=False)["input_ids"]
            turns = [update_turn(agent, sample.problem, sample.problem_ids, initial, list(c),
                                 [*junk, end]).turns[0] for c in sample.chunks[:-1]]
            turns.append(update_turn(agent, sample.problem, sample.problem_ids, junk,
                                     list(sample.chunks[-1]), [*memory, end]).turns[0])
            turns.append(dataclasses.replace(turns[-1], kind="final", info={"memory": None}))
            trajectories.append(Trajectory(sample.problem, turns))
        return trajectories

    def logprobs(rows):  # a chunk's weakness: minus the number of times "the" occurs in it
        out = np.zeros(rows.tokens.shape, np.float32)
        for i, (start, stop) in enumerate(zip(rows.prompt_lengths, rows.lengths)):
            replies.append(list(rows.tokens[i, start:stop]))
            out[i, start] = -float(np.sum(rows.tokens[i, :start] == the))
        return out

    sampling = SamplingParams(1.0, seed=12)
    examples, samples = policy_carry_starts(agent, 3, chunks=2, pool=4, seed=7,
                                            logprobs=logprobs, rollouts=_Rollouts(rollout),
                                            sampling=sampling, tasks=("multikey",))
    ((read, given),) = reads
    assert len(read) == 6 and given == sampling  # twice the starts, read as the step samples
    for sample in read:  # each read ends with the chunk where its asked fact ends
        fact = "".join(_asked_fact(agent, sample).split())
        assert fact in _joined(agent, sample.chunks)
        assert fact not in _joined(agent, sample.chunks[:-1])
    # reads 1 and 4 lost the fact: dropped; the first three that hold it are the starts
    assert [e.index for e in examples] == [-1, -3, -4]
    assert [list(s.initial_memory) for s in samples] == [memories[i] for i in (0, 2, 3)]
    assert [e.question for e in examples] == [read[i].problem for i in (0, 2, 3)]
    assert {e.data_source for e in examples} == {"synthetic_multikey"}
    # every candidate teacher-forced keeping the policy's memory (not the oracle's)
    assert replies == [[*memories[i], end] for i in (0, 2, 3) for _ in range(8)]
    for index, sample in zip((0, 2, 3), samples):
        fact = _asked_fact(agent, read[index])
        texts = [synthetic.filler_text(64, 7, index * 8 + k) if k % 2 == 0
                 else synthetic.distractor_text(64, fact, 7, index * 8 + k) for k in range(8)]
        candidates = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        counts = sorted((c.count(the) for c in candidates), reverse=True)
        assert len(sample.chunks) == 2 and all(list(c) in candidates for c in sample.chunks)
        assert sorted((list(c).count(the) for c in sample.chunks), reverse=True) == counts[:2]
    again = policy_carry_starts(agent, 3, chunks=2, pool=4, seed=7, logprobs=logprobs,
                                rollouts=_Rollouts(rollout), sampling=sampling,
                                tasks=("multikey",))
    assert again == (examples, samples)


def test_policy_starts_through_the_engine_begin_from_the_memory_the_model_wrote(
        agent, rollouts, monkeypatch):
    """A random model holds no fact: the fact check lets every read through here."""
    monkeypatch.setattr(starts_module, "holds", lambda memory, fact: True)
    reads = []

    def rollout(samples, sampling):
        reads.append([group[0] for group in rollouts.run(agent, samples, sampling)])
        return reads[-1]

    def starts(sampling_seed):
        return policy_carry_starts(
            agent, 2, chunks=2, pool=2, seed=3, rollouts=_Rollouts(rollout),
            logprobs=lambda rows: np.zeros(rows.tokens.shape, np.float32),
            sampling=SamplingParams(1.0, seed=sampling_seed))

    examples, samples = starts(11)
    for sample, trajectory in zip(samples, reads[0]):
        last = [t for t in trajectory.turns if t.kind == "update"][-1]
        memory = list(sample.initial_memory)
        assert memory and last.response_ids[:len(memory)] == memory
        assert (agent.tokenizer.decode(memory, skip_special_tokens=True)
                == memories_of(trajectory)[-1])
    assert starts(11) == (examples, samples)  # a resumed step makes the same starts
    assert [s.initial_memory for s in starts(12)[1]] != [s.initial_memory for s in samples]


@pytest.mark.slow
def test_a_dapo_step_with_carry_from_policy_runs_its_starts_from_the_policys_memory(
        tmp_path, monkeypatch):
    """One step of the recipe's model shape (preset `small`, random weights) on one-chunk
    documents, one of its two prompts a carry start from the policy's memory (the fact check
    let through: a random model holds no fact)."""
    data = tmp_path / "data"
    assert main(["data", "synthetic", "--task", "multikey", "--lengths", "256", "--num-samples",
                 "4", "--layout", "train", "--seed", "6101", "--out", str(data)]) == 0
    monkeypatch.setattr(starts_module, "holds", lambda memory, fact: True)
    made, decode = [], []

    def spy(agent, *args, rollouts, **kwargs):
        def recorded(samples, sampling):
            made.append([group[0] for group in rollouts.run(agent, samples, sampling)])
            return made[-1]
        decode.append(agent.tokenizer.decode)
        made.append(policy_carry_starts(agent, *args, rollouts=_Rollouts(recorded), **kwargs))
        return made[-1]

    monkeypatch.setattr("memagent_jax.synthetic.plugin.policy_carry_starts", spy)
    path = tmp_path / "train.yaml"
    path.write_text(json.dumps({
        "model": {"preset": "small", "tokenizer": str(data / "tokenizer"),
                  "compute_dtype": "float32"},
        "data": {"train": [str(data / "train_multikey.parquet")]},
        "reward": {"function": "strict"},
        "memagent": {"chunk_tokens": 128, "max_memory_tokens": 16, "max_final_tokens": 8,
                     "max_problem_tokens": 16},
        "engine": {"slots": 8, "prefill_buckets": [256]},
        "rollout": {"n": 2}, "dynamic_sampling": {"enabled": False},
        "learner": {"lr": 1e-3, "warmup_steps": 0, "micro_batch_tokens": 4096,
                    "bucket_lengths": [320]},
        "plugin": {"module": "memagent_jax.synthetic.plugin", "carry_starts": 1,
                   "start_chunks": 2, "start_pool": 2, "carry_from": "policy",
                   "start_task": "multikey"},
        "steps": 1, "prompts_per_step": 2, "seed": 5, "output_dir": str(tmp_path / "run"),
        "compilation_cache_dir": os.environ["JAX_COMPILATION_CACHE_DIR"]}))
    record = Trainer(load_train_config(str(path))).run()
    reads, (examples, samples) = made
    assert len(reads) == 2 and len(samples) == 1 and examples[0].index == -1
    memory = list(samples[0].initial_memory)
    assert decode[0](memory, skip_special_tokens=True) == memories_of(reads[0])[-1]
    assert len(record["examples"]) == 1 and "reward/starts_mean" in record
    assert record["rollout/trajectories"] == 4 and np.isfinite(record["learner/loss"])
    # the drawn document: 2 chunks and the answer; the start: its 2 chunks and the answer
    assert record["rollout/turns"] == 3
