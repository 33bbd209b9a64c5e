"""The warm-up's extra rows: one-turn trajectories a supervised step trains on beside the oracle
trajectories (oracle.py), each kind drawn by the step's seed as the `plugin` section asks.

- copy rows: a random span of the tasks' words, repeated (copying by matching words);
- recall rows: fact sentences, repeated in another order (finding a value by its key);
- fact rows: the update turn at a document's first fact, half of them with a wrong value for
  it in the memory, the reply the oracle's memory with the chunk's fact;
- carry rows: update turns whose memory holds the question's facts and whose chunk holds none,
  the reply the memory unchanged; the hardest of a pool by the current parameters.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from memagent_jax.agents.memagent.agent import MemAgent
from memagent_jax.rl.rows import TrainingRows, rows_from_trajectories
from memagent_jax.rollout.agent_api import Trajectory, Turn
from memagent_jax.synthetic.oracle import (
    document_state,
    end_token,
    first_facts,
    memory_ids,
    update_turn,
)
from memagent_jax.synthetic.tasks import CITY_FACT, CODE_FACT, filler_text, words
from memagent_jax.tokenizer import word_ids

COPY_DRAWS = ("log_uniform", "uniform")  # how copy rows draw span lengths and gaps


def copy_trajectories(tokenizer, count: int, span: int, seed: int, min_span: int = 1,
                      gap: int = 0, prefix: int = 0, draw: str = "log_uniform"
                      ) -> list[Trajectory]:
    """`count` one-turn trajectories: the prompt is 0 to `prefix` random words of the synthetic
    tasks' vocabulary (drawn by `seed`, uniformly many), a span of `min_span` to `span` such
    words, then 0 to `gap` more; the reply is the span again and the end-of-text token. Span
    lengths and gaps are drawn log-uniformly (as many of 0-10 words as of 10-100), or uniformly
    with draw "uniform"."""
    if draw not in COPY_DRAWS:
        raise ValueError(f"draw must be one of {COPY_DRAWS}, got {draw!r}")
    uniform = draw == "uniform"
    rng = np.random.default_rng(seed)
    ids = np.asarray(word_ids(tokenizer, words().all()))
    trajectories = []
    for _ in range(count):
        if uniform:
            length = int(rng.integers(min_span, span + 1))
        else:
            length = int(np.exp(rng.uniform(np.log(min_span), np.log(span + 1))))
        before = rng.choice(ids, int(rng.integers(0, prefix + 1))).tolist() if prefix else []
        span_ids = rng.choice(ids, length).tolist()
        after = []
        if gap:
            between = (int(rng.integers(0, gap + 1)) if uniform else
                       int(np.expm1(rng.uniform(0, np.log1p(gap + 1)))))
            after = rng.choice(ids, between).tolist()
        trajectories.append(_one_turn("copy", before + span_ids + after, span_ids, tokenizer))
    return trajectories


def recall_trajectories(tokenizer, count: int, facts: int, seed: int) -> list[Trajectory]:
    """`count` one-turn trajectories: the prompt is `facts` fact sentences of the synthetic
    tasks' forms (a key's or a city's code, a person's city) with words drawn by `seed`, the
    reply the same sentences in another order and the end-of-text token: each fact's value is
    found only by its key."""
    rng = np.random.default_rng(seed)
    w = words()
    forms = [(CODE_FACT, w.keys, w.values), (CITY_FACT, w.people, w.cities),
             (CODE_FACT, w.cities, w.values)]
    trajectories = []
    for _ in range(count):
        sentences = []
        for _ in range(facts):
            form, subjects, objects = forms[rng.integers(len(forms))]
            sentences.append(form.format(rng.choice(subjects), rng.choice(objects)))
        reordered = [sentences[i] for i in rng.permutation(facts)]
        prompt, reply = (tokenizer(" ".join(text), add_special_tokens=False)["input_ids"]
                         for text in (sentences, reordered))
        trajectories.append(_one_turn("recall", prompt, reply, tokenizer))
    return trajectories


def fact_trajectories(agent: MemAgent, count: int, seed: int) -> list[Trajectory]:
    """`count` one-turn trajectories: the update turn of `agent` at the chunk where the oracle's
    memory first takes a fact in a synthetic document (`oracle.first_facts`, drawn by `seed`),
    given the oracle's memory before that chunk, and the oracle's reply, the memory with the
    chunk's fact. In every other one the memory also holds the same fact with a wrong object
    ("the code of KEY WRONG ."), which the reply replaces."""
    rng = np.random.default_rng(seed)
    w, end = words(), end_token(agent)
    trajectories: list[Trajectory] = []
    for _, state, at, fact, memory in first_facts(agent, rng, seed):
        if len(trajectories) == count:
            break
        if len(trajectories) % 2:
            *form, subject, right, stop = fact.split()
            objects = w.cities if form[1] == "city" else w.values
            wrong = right
            while wrong == right:
                wrong = objects[int(rng.integers(len(objects)))]
            memory = "\n".join([*memory.splitlines(), " ".join([*form, subject, wrong, stop])])
        trajectories.append(update_turn(agent, state.question, state.problem,
                                        memory_ids(agent, memory), list(state.chunks[at]),
                                        [*memory_ids(agent, state.memories[at]), end]))
    return trajectories


def carry_trajectories(agent: MemAgent, count: int, pool: int, seed: int,
                       logprobs: Callable[[TrainingRows], np.ndarray],
                       cut: bool = False) -> list[Trajectory]:
    """The `count` hardest (`hardest`, by `logprobs`: rows -> [R, T] reply-token log-probs
    under the current parameters) of the `count * pool` `carry_candidates` drawn by `seed`."""
    return hardest(carry_candidates(agent, count * pool, seed, cut), count, logprobs)


def carry_candidates(agent: MemAgent, count: int, seed: int, cut: bool = False
                     ) -> list[Trajectory]:
    """`count` carries drawn by `seed`: update turns of `agent` whose memory is the oracle's
    after the last chunk of a synthetic document (`oracle.document_state`: every fact its
    question needs) and whose chunk is chunk_tokens of filler (`filler_chunk`, `cut` or not),
    the reply the memory unchanged."""
    rng = np.random.default_rng(seed)
    end = end_token(agent)
    candidates = []
    for index in range(count):
        state = document_state(agent, rng, seed, index)
        held = memory_ids(agent, state.memories[-1])
        candidates.append(update_turn(agent, state.question, state.problem, held,
                                      filler_chunk(agent, seed, index, cut), [*held, end]))
    return candidates


def filler_chunk(agent: MemAgent, seed: int, index: int, cut: bool) -> list[int]:
    """Chunk `index` of filler text drawn by `seed`, chunk_tokens of ids: whole sentences, the
    first opening it; with `cut`, cut from four chunks' filler at a random token, starting and
    ending mid-sentence as a long document's chunks do."""
    size = agent.config.chunk_tokens
    text = agent.tokenizer(filler_text(4 * size if cut else size, seed, index),
                           add_special_tokens=False)["input_ids"]
    start = 0
    if cut:  # its own generator: the documents drawn stay those of the uncut rows
        start = int(np.random.default_rng((seed, index)).integers(len(text) - size + 1))
    return text[start:start + size]


def hardest(candidates: list[Trajectory], count: int,
            logprobs: Callable[[TrainingRows], np.ndarray]) -> list[Trajectory]:
    """The `count` one-turn `candidates` whose least likely reply token has the lowest
    log-probability under `logprobs` (`weakest_reply_token`), hardest first."""
    weakest = weakest_reply_token(candidates, logprobs)
    return [candidates[i] for i in np.argsort(weakest, kind="stable")[:count]]


def weakest_reply_token(trajectories: list[Trajectory],
                        logprobs: Callable[[TrainingRows], np.ndarray]) -> np.ndarray:
    """[N] the lowest log-probability under `logprobs` of any reply token of each one-turn
    trajectory, its turn teacher-forced."""
    rows = rows_from_trajectories([[t] for t in trajectories], np.ones(len(trajectories)))
    values = np.asarray(logprobs(rows))
    positions = np.arange(values.shape[1])[None, :]
    reply = (positions >= rows.prompt_lengths[:, None]) & (positions < rows.lengths[:, None])
    return np.where(reply, values, np.inf).min(axis=1)


def _one_turn(kind: str, prompt: list[int], reply: list[int], tokenizer) -> Trajectory:
    """A trajectory of one turn that replies `reply` and the end-of-text token to `prompt`."""
    reply = [*reply, tokenizer.eos_token_id]
    return Trajectory("", [Turn(kind, prompt, reply, [0.0] * len(reply), "stop", "")])
