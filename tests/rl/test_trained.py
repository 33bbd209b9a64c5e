"""What is trained, for a person to read (rl/trained.py): `run --show-tokens` marks exactly the
tokens the row trains, and logs/rollouts.jsonl's records are the rows as trained."""

import json
import re
import types

import numpy as np

from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Scheduler
from memagent_jax.rl.rows import rows_from_trajectories
from memagent_jax.rl.trained import CLOSE, OPEN, rollout_records, show_tokens
from memagent_jax.rollout.runner import AgentRunner
from tests.builders import EOS, ReplyEngine, two_conversations


def _trajectories(word_tokenizer, rows=1, n=1):
    ids = word_tokenizer("the answer is", add_special_tokens=False)["input_ids"]
    runner = AgentRunner(Scheduler(ReplyEngine(word_tokenizer, lambda prompt: ids + [EOS])),
                         word_tokenizer, (EOS,))
    agent = types.SimpleNamespace(rollout=two_conversations, name="two_calls")
    return runner.run(agent, [types.SimpleNamespace(question="where is it ?")] * rows,
                      SamplingParams(1.0, seed=1), n=n)


def test_show_tokens_marks_exactly_the_trained_tokens(word_tokenizer):
    (trajectory,), = _trajectories(word_tokenizer)
    rows = rows_from_trajectories([trajectory], [0.0])
    text = show_tokens(trajectory, word_tokenizer)
    id_lines = [line[len("ids: "):] for line in text.splitlines() if line.startswith("ids: ")]
    assert len(id_lines) == len(rows) == 2
    for r, line in enumerate(id_lines):
        marks, trained = [], False
        for piece in re.findall(f"[{OPEN}{CLOSE}]|\\d+", line):
            if piece in (OPEN, CLOSE):
                trained = piece == OPEN
            else:
                marks.append((int(piece), int(trained)))
        n = rows.lengths[r]
        assert marks == list(zip(rows.tokens[r, :n].tolist(),
                                 rows.loss_mask[r, :n].astype(int).tolist()))
    assert [line.count(OPEN) for line in id_lines] == [2, 1]  # the two replies; the one
    assert text.splitlines()[1].endswith(f"{OPEN}the answer is </s>{CLOSE}")


def test_rollout_records_are_the_trained_rows(word_tokenizer):
    groups = _trajectories(word_tokenizer, rows=2, n=2)
    advantages = np.array([[0.5, -0.5], [0.0, 0.0]], np.float32)
    rewards = np.array([[1.0, 0.0], [np.nan, 1.0]], np.float32)
    rows = rows_from_trajectories(groups, advantages)
    records = [json.loads(json.dumps(r)) for r in
               rollout_records(7, groups, rewards, advantages, count=3)]
    assert [(r["step"], r["group"], r["sample"]) for r in records] == [(7, 0, 0), (7, 0, 1),
                                                                        (7, 1, 0)]
    assert [r["reward"] for r in records] == [1.0, 0.0, None]
    assert [r["advantage"] for r in records] == [0.5, -0.5, 0.0]
    for i, record in enumerate(records):
        mine = np.flatnonzero(rows.trajectory == i)
        assert len(record["conversations"]) == len(mine) == 2
        for conversation, r in zip(record["conversations"], mine):
            n = rows.lengths[r]
            assert conversation["ids"] == rows.tokens[r, :n].tolist()
            assert conversation["loss_mask"] == rows.loss_mask[r, :n].astype(int).tolist()
            assert conversation["logprobs"] == rows.rollout_logprobs[r, :n].tolist()
        assert record["conversations"][0]["messages"][-1]["role"] == "assistant"
