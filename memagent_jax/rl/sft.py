"""Supervised warm-up on oracle trajectories: the memory loop as an ideal reader runs it.

For a training row that records its facts (`memagent-jax data synthetic --layout train`), the
oracle trajectory has the agent's own turns (the same chunks, the same prompts in token ids,
each prompt built from the previous oracle reply as the agent builds it from its own) with the
replies an ideal memory gives: after each chunk, the facts read so far that bear on the question
(`data.synthetic.oracle_memories`; the initial memory's words while there are none), and in the
final turn those facts again and `\\boxed{answer}`; each reply ends with the end-of-text token
that stops the engine.

Its rows (one per turn, as DAPO's) are trained with the token-mean negative log-likelihood of
the replies (`learner.loss: sft`, `sft_loss`): the same rows, micro-batches, mesh, optimiser and
checkpoints as DAPO, and the same validation through the memory loop.

A model trained from scratch must first learn to copy (a key from the question, a value from
the chunk, the memory from the prompt), and the oracle's rows hold a couple of copied tokens
in a few hundred: the small preset learns no copying from them in hundreds of steps. Rows that
repeat a random span (`copy_trajectories`, `learner.copy_rows` a step) make every reply token a
copy; with them it copies within about a hundred steps (docs/synthetic.md). Copying is not yet
looking up: to write "the code of KEY VALUE" the agent must find VALUE by its KEY, and an
oracle row asks that once in a few hundred tokens. Rows that list facts and then the same facts
in another order (`recall_trajectories`, `learner.recall_rows` a step) ask it for every value.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, NamedTuple

import jax.numpy as jnp
import numpy as np

from memagent_jax.data.pipeline import Example, take
from memagent_jax.data.synthetic import (CITY_FACT, CODE_FACT, TASKS, filler_text, make_sample,
                                         oracle_memories, words)
from memagent_jax.errors import UserError
from memagent_jax.rl.collect import RolloutBatch, rollout_stats, score
from memagent_jax.rl.rows import TrainingRows, rows_from_trajectories
from memagent_jax.rollout.memagent import MemoryAgent, Sample, Trajectory, Turn, memory_turns

COPY_DRAWS = ("log_uniform", "uniform")  # how copy rows draw span lengths and gaps
FILLER_MEMORIES = ("any", "held", "initial")  # the memory a filler row is given


def sft_loss(logp, mask, row_weights, entropy=None):
    """logp, mask [rows, T] (mask 1 on reply tokens), row_weights [rows] as `dapo.policy_loss`
    takes them -> (the weighted token sum of -logp, metrics with policy_loss's names: loss and pg_loss
    the same negative log-likelihood, the clip and KL metrics 0, entropy when given)."""
    weights = jnp.asarray(mask, jnp.float32) * jnp.asarray(row_weights, jnp.float32)[:, None]
    nll = -jnp.sum(logp * weights)
    zero = jnp.zeros((), jnp.float32)
    metrics = {"loss": nll, "pg_loss": nll, "clip_fraction": zero, "dual_clip_fraction": zero,
               "approx_kl": zero, "kl": zero,
               "entropy": zero if entropy is None else jnp.sum(entropy * weights)}
    return nll, metrics


def oracle_trajectory(agent: MemoryAgent, example: Example) -> Trajectory:
    """The oracle trajectory of `example` (module docstring), in `agent`'s tokens, chunks and
    prompts. Raises UserError when the row records no facts."""
    facts = (example.extra_info or {}).get("facts")
    if not facts:
        raise UserError(f"training row {example.index} ({example.data_source}) has no "
                        "extra_info.facts: learner.loss sft trains on rows from `memagent-jax "
                        "data synthetic --layout train`")
    tokenizer, prompts = agent.tokenizer, agent.prompts
    sample = agent.read(example.question, example.context, strict=False)
    texts = [tokenizer.decode(chunk) for chunk in sample.chunks]
    facts_read = oracle_memories(texts, facts)
    memories = [tokenizer(m, add_special_tokens=False)["input_ids"] if m
                else list(prompts.initial_memory) for m in facts_read]
    end = end_token(agent)
    # The final reply restates the facts it answers from before the boxed answer: the answer is
    # then a copy of a word a few tokens back, not of one found in the prompt with nothing
    # pointing at it (docs/synthetic.md). The verifier reads only the box.
    answer = " ".join([facts_read[-1].replace("\n", " "),
                       f"\\boxed{{{example.ground_truths[0]}}}"]).strip()
    replies = memories + [tokenizer(answer, add_special_tokens=False)["input_ids"]]
    trajectory = Trajectory(example.question)
    workflow = memory_turns(sample.chunks, prompts.initial_memory)
    memory = None
    for reply in replies:
        kind, previous, chunk = workflow.send(memory)
        prompt = (prompts.update(sample.problem_ids, previous, chunk) if kind == "update"
                  else prompts.final(sample.problem_ids, previous))
        trajectory.turns.append(Turn(kind, prompt, [*reply, end], [0.0] * (len(reply) + 1),
                                     "stop", tokenizer.decode(reply)))
        memory = reply
    trajectory.answer = example.ground_truths[0]
    return trajectory


def copy_trajectories(tokenizer, count: int, span: int, seed: int, min_span: int | None = None,
                      gap: int = 0, prefix: int = 0, draw: str = "log_uniform"
                      ) -> list[Trajectory]:
    """`count` one-turn trajectories: the prompt is 0 to `prefix` random words of the synthetic
    tasks' vocabulary (drawn by `seed`, uniformly many), a span of such words, then 0 to `gap`
    more; the reply is the span again and the end-of-text token. Spans are `span` words, or of
    lengths drawn from [min_span, span]. Lengths and gaps are drawn log-uniformly (as many of
    0-10 words as of 10-100). Each of the three varies so that the copy is not at one place:
    with one length the model learned to copy from a fixed distance back, with every span at
    the row's start to copy from the sequence's start, and with uniform lengths and gaps
    (copies less than ~12 words back rare) never to copy from that near, which is where a final
    turn's memory lies; none of these looks anything up. The long gaps put the copy as far
    back as a memory update's (docs/synthetic.md). draw "uniform" draws lengths and gaps
    uniformly instead, as the recipe's steps 0-2 were run: from random weights, the
    log-uniform draw's short spans left step 0 without copying after its 300 steps."""
    if draw not in COPY_DRAWS:
        raise ValueError(f"draw must be one of {COPY_DRAWS}, got {draw!r}")
    uniform = draw == "uniform"
    rng = np.random.default_rng(seed)
    ids = np.asarray(tokenizer.convert_tokens_to_ids(words().all()))
    trajectories = []
    for _ in range(count):
        if min_span is None:
            length = span
        elif uniform:
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


def filler_trajectories(agent: MemoryAgent, count: int, seed: int, memory: str = "any",
                        cut: bool = False) -> list[Trajectory]:
    """`count` one-turn trajectories: an update turn of `agent` whose chunk is chunk_tokens of
    filler text (no fact), and the oracle's reply to it, the memory it was given unchanged.
    Each takes its question and memory from the oracle trajectory of a synthetic document
    (`document_state`, drawn by `seed`), as `memory` says: "any", the memory after one of its
    chunks, chosen uniformly, so that empty memories and memories holding facts both occur;
    "held", the memory after its last chunk, which holds every fact the question needs (a
    carry: what a long document asks of the agent thousands of times); "initial", the initial
    memory (a long document's turns before its first fact, where an agent that makes up a
    value for the asked key begins to go wrong). The chunk is whole filler sentences,
    the first opening it; with `cut`, chunk_tokens cut from four chunks' filler at a random
    token, starting and ending mid-sentence as a long document's chunks do. Documents of one
    or two chunks hold their four to six facts in 512 tokens at most and seldom have a chunk
    without one, while a long document is almost nothing else. Alone (32 a step) filler rows
    over-corrected the made-up first memory into a memory that ignores its chunk
    (docs/synthetic.md); the recipe does without them."""
    if memory not in FILLER_MEMORIES:
        raise ValueError(f"memory must be one of {FILLER_MEMORIES}, got {memory!r}")
    rng = np.random.default_rng(seed)
    end = end_token(agent)
    trajectories = []
    for index in range(count):
        state = document_state(agent, rng, seed, index)
        memories = state.memories
        if memory == "any":
            memory_text = memories[int(rng.integers(len(memories)))]
        else:
            memory_text = memories[-1] if memory == "held" else ""
        given = memory_ids(agent, memory_text)
        trajectories.append(update_turn(agent, state.question, state.problem, given,
                                        filler_chunk(agent, seed, index, cut), [*given, end]))
    return trajectories


def filler_chunk(agent: MemoryAgent, seed: int, index: int, cut: bool) -> list[int]:
    """Chunk `index` of filler text drawn by `seed`, chunk_tokens of ids: whole sentences, or
    with `cut` cut from four chunks' filler at a random token (`filler_trajectories`)."""
    size = agent.config.chunk_tokens
    text = agent.tokenizer(filler_text(4 * size if cut else size, seed, index),
                           add_special_tokens=False)["input_ids"]
    start = 0
    if cut:  # its own generator: the documents drawn stay those of the uncut rows
        start = int(np.random.default_rng((seed, index)).integers(len(text) - size + 1))
    return text[start:start + size]


def carry_trajectories(agent: MemoryAgent, count: int, pool: int, seed: int,
                       logprobs: Callable[[TrainingRows], np.ndarray],
                       cut: bool = False) -> list[Trajectory]:
    """The `count` hardest of `count * pool` carries (`filler_trajectories` of the "held"
    memory, `cut` or not, drawn by `seed`): those whose least likely reply token has the lowest
    log-probability under `logprobs` (rows -> [R, T] log-probs of the reply tokens, 0
    elsewhere: the learner's, under the current parameters). At 1M tokens the agent loses a
    fact it has written once in a few thousand carries, at carries whose teacher-forced reply
    already ranks another word first (`memagent-jax trace --carries`, docs/synthetic.md);
    carries drawn at random are almost all easy, so the step trains on those the model now
    finds hardest."""
    return hardest(filler_trajectories(agent, count * pool, seed, "held", cut), count, logprobs)


def hardest(candidates: list[Trajectory], count: int,
            logprobs: Callable[[TrainingRows], np.ndarray]) -> list[Trajectory]:
    """The `count` one-turn `candidates` whose least likely reply token has the lowest
    log-probability under `logprobs` (`weakest_reply_token`), hardest first."""
    weakest = weakest_reply_token(candidates, logprobs)
    return [candidates[i] for i in np.argsort(weakest, kind="stable")[:count]]


def weakest_reply_token(trajectories: list[Trajectory],
                        logprobs: Callable[[TrainingRows], np.ndarray]) -> np.ndarray:
    """[N] the lowest log-probability under `logprobs` of any reply token of each one-turn
    trajectory (its turn teacher-forced: a carry whose value is low is one the policy may
    rewrite)."""
    rows = rows_from_trajectories([[t] for t in trajectories], np.ones(len(trajectories)))
    values = np.asarray(logprobs(rows))
    positions = np.arange(values.shape[1])[None, :]
    reply = (positions >= rows.prompt_lengths[:, None]) & (positions < rows.lengths[:, None])
    return np.where(reply, values, np.inf).min(axis=1)


def fact_trajectories(agent: MemoryAgent, count: int, seed: int) -> list[Trajectory]:
    """`count` one-turn trajectories: the update turn of `agent` at the chunk where the oracle's
    memory first takes a fact in a synthetic document (`document_state`, drawn by `seed`),
    given the oracle's memory before that chunk, and the oracle's reply, the memory with the
    chunk's fact. In every other one the memory also holds the same fact with a wrong object
    ("the code of KEY WRONG ."), which the reply replaces. The supervised documents (one or two
    chunks, four to six facts) show a needed fact mostly among others in its chunk, while in a
    long document it stands alone among filler; and an agent that had written a made-up value
    for the asked key kept it when the real fact came, a memory no oracle trajectory
    contradicts (docs/synthetic.md)."""
    rng = np.random.default_rng(seed)
    w, end = words(), end_token(agent)
    trajectories = []
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


def first_facts(agent: MemoryAgent, rng, seed: int):
    """Yields (index, DocumentState, at, fact, before) for documents 0, 1, ... drawn by `rng`
    and `seed` (`document_state`; a caller may draw from `rng` between documents): the chunk
    `at` where the oracle's memory first takes a fact, that fact, and the oracle's memory
    before that chunk (text, "" for the initial one); documents whose first fact is cut by the
    chunk boundary (the chunk alone does not say it) are skipped."""
    index = 0
    while True:
        state = document_state(agent, rng, seed, index)
        before = [""] + state.memories
        at, fact = next((i, f) for i, m in enumerate(state.memories) for f in m.splitlines()
                        if f not in before[i].splitlines())
        if "".join(fact.split()) in "".join(agent.tokenizer.decode(state.chunks[at]).split()):
            yield index, state, at, fact, before[at]
        index += 1


def own_fact_trajectories(agent: MemoryAgent, count: int, seed: int,
                          greedy: Callable[[list[Sample]], list[list[Trajectory]]]
                          ) -> list[Trajectory]:
    """`count` one-turn trajectories: the update turn at the chunk of a document's first fact
    (`first_facts`, drawn by `seed`, documents whose memory before it is the initial one),
    given the memory the current model itself writes before any fact, and the oracle's reply,
    the memory with the chunk's fact. That memory is the model's reply to the initial memory
    and a fact-free chunk of filler cut as a long document's (`greedy`: samples -> their
    trajectories read greedily under the current parameters): nearly always a made-up value
    for the asked key, one of a few words the model favours, which the fact's chunk must
    replace (docs/synthetic.md); fact rows' wrong values are drawn uniformly instead."""
    end, drawn = end_token(agent), []
    for index, state, at, _, before in first_facts(agent, np.random.default_rng(seed), seed):
        if len(drawn) == count:
            break
        if not before:
            drawn.append((index, state, at))
    chunks = [tuple(filler_chunk(agent, seed, index, cut=True)) for index, _, _ in drawn]
    groups = greedy([Sample(state.question, state.problem, (chunk,), len(chunk))
                     for (_, state, _), chunk in zip(drawn, chunks)])
    trajectories = []
    for (_, state, at), (trajectory, *_) in zip(drawn, groups):
        own = [t for t in trajectory.turns[0].response_ids if t not in agent.not_memory]
        trajectories.append(update_turn(agent, state.question, state.problem, own,
                                        list(state.chunks[at]),
                                        [*memory_ids(agent, state.memories[at]), end]))
    return trajectories


class DocumentState(NamedTuple):
    """A synthetic document as the agent reads it: its task, question and answer, the
    question's ids, its chunks' ids, and the oracle's memory after each chunk (text)."""
    task: str
    question: str
    answer: str
    problem: tuple[int, ...]
    chunks: tuple[tuple[int, ...], ...]
    memories: list[str]


def document_state(agent: MemoryAgent, rng, seed: int, index: int) -> DocumentState:
    """Document `index` of a task drawn by `rng` (1,024 tokens: four chunks of 256; seed -1 -
    `seed`). The seed is negated so that no data set of a step's seed (1, 2, ...), the
    evaluation's among them, holds these documents."""
    task = TASKS[int(rng.integers(len(TASKS)))]
    document = make_sample(task, 1024, -1 - seed, index)
    sample = agent.read(document.question, document.context, strict=False)
    memories = oracle_memories([agent.tokenizer.decode(chunk) for chunk in sample.chunks],
                               [dataclasses.asdict(fact) for fact in document.facts])
    return DocumentState(task, document.question, document.answer, sample.problem_ids,
                         sample.chunks, memories)


def memory_ids(agent: MemoryAgent, memory: str) -> list[int]:
    """A memory's ids: its text's, or the initial memory's when it is empty."""
    return (agent.tokenizer(memory, add_special_tokens=False)["input_ids"] if memory
            else list(agent.prompts.initial_memory))


def update_turn(agent: MemoryAgent, question: str, problem, memory: list[int], chunk,
                reply: list[int]) -> Trajectory:
    """A trajectory of one update turn of `agent`: `reply` to (problem, memory, chunk)."""
    return Trajectory(question, [Turn(
        "update", agent.prompts.update(problem, memory, chunk), reply, [0.0] * len(reply),
        "stop", agent.tokenizer.decode(reply[:-1]))])


def warmup_trajectories(agent: MemoryAgent, learner, seed: int,
                        logprobs: Callable[[TrainingRows], np.ndarray] | None = None,
                        greedy: Callable[[list[Sample]], list[list[Trajectory]]] | None = None
                        ) -> list[Trajectory]:
    """The copy, recall, filler, blank, fact and carry rows a supervised step trains beside its
    oracle trajectories, drawn by `seed`, as `learner` (a LearnerConfig: copy_*, recall_*,
    filler_rows, blank_rows, fact_*, own_fact_rows and carry_* settings) asks for them; carry
    rows, and fact rows from a pool, are chosen by `logprobs` (`hardest`), and own-fact rows
    take their memories from `greedy` (`own_fact_trajectories`), which they need."""
    tokenizer = agent.tokenizer
    return (copy_trajectories(tokenizer, learner.copy_rows, learner.copy_span, seed,
                              learner.copy_span_min, learner.copy_gap, learner.copy_prefix,
                              learner.copy_draw)
            + recall_trajectories(tokenizer, learner.recall_rows, learner.recall_facts, seed)
            + filler_trajectories(agent, learner.filler_rows, seed)
            + filler_trajectories(agent, learner.blank_rows, seed, "initial", cut=True)
            + (hardest(fact_trajectories(agent, learner.fact_rows * learner.fact_pool, seed),
                       learner.fact_rows, logprobs) if learner.fact_pool > 1
               else fact_trajectories(agent, learner.fact_rows, seed))
            + (own_fact_trajectories(agent, learner.own_fact_rows, seed, greedy)
               if learner.own_fact_rows else [])
            + (carry_trajectories(agent, learner.carry_rows, learner.carry_pool, seed, logprobs,
                                  learner.carry_cut)
               if learner.carry_rows else []))


def end_token(agent: MemoryAgent) -> int:
    """The token an oracle reply ends with: end-of-text where it stops the engine."""
    tokenizer = agent.tokenizer
    return (tokenizer.eos_token_id if tokenizer.eos_token_id in agent.stop_ids
            else agent.stop_ids[0])


def _one_turn(kind: str, prompt: list[int], reply: list[int], tokenizer) -> Trajectory:
    """A trajectory of one turn that replies `reply` and the end-of-text token to `prompt`."""
    reply = [*reply, tokenizer.eos_token_id]
    return Trajectory("", [Turn(kind, prompt, reply, [0.0] * len(reply), "stop", "")])


def oracle_batch(agent: MemoryAgent, iterator, prompts: int, reward: str) -> RolloutBatch:
    """`collect.collect_batch`'s result for a supervised step: the next `prompts` examples, one
    oracle trajectory each (groups of 1), and their final replies' rewards by the verifier
    `reward` names (data.reward), which are 1 unless the answer format and the tokenizer
    disagree."""
    start = time.perf_counter()
    examples = take(iterator, prompts)
    groups = [[oracle_trajectory(agent, e)] for e in examples]
    rewards = score(examples, groups, reward)
    stats = rollout_stats(groups, rewards, rewards)
    stats["time/rollout_s"] = time.perf_counter() - start
    return RolloutBatch(examples, groups, rewards, [e.index for e in examples], 1, stats)
