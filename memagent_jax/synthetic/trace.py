"""`memagent-jax trace`: where a memory agent's memory goes wrong, turn by turn, on fresh
synthetic documents.

The agent reads `num_samples` documents of (task, length, seed) greedily, as `eval` and `demo`
read. For each fact the answer needs (multikey: the asked key's code; twohop: the person's city
and that city's code), the trace takes the turn after which an ideal memory first holds it
(`tasks.oracle_memories`: the fact's chunk, or the next one when the chunk boundary
cuts it) and follows the agent's memory from there (`follow`):

- kept: the memory holds the fact after that turn and to the last chunk;
- late: it first holds it after a later turn, then to the last chunk;
- unwritten: it never holds it after that turn;
- lost: it held it, then dropped it after a later turn.

A document's outcome is its first needed fact's that was not kept (else kept). Each document
prints one line: the outcome, where the fact began (chunk and word in the chunk), what the
memory held after the turn that went wrong, and whether the answer was right; a summary counts
the outcomes and lists the words at which unwritten facts began.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import json

OUTCOMES = ("kept", "late", "unwritten", "lost")


def holds(memory: str, fact: str) -> bool:
    """Whether `memory` (a reply as the tokenizer decodes it) states `fact` ("the code of KEY
    VALUE ."): its words but the full stop, in a row. Compared word by word, since a decoder
    may join a full stop to the word before it."""
    return _says(memory, fact.split()[:-1])


def made_up(memories: list[str], fact: str, due: int) -> int | None:
    """The first turn before `due` (0-based) after which `memories` state something of
    `fact`'s subject ("the code of KEY"), a value made up before the fact was read; None when
    none does."""
    subject = fact.split()[:4]
    return next((t for t in range(due) if _says(memories[t], subject)), None)


def _says(memory: str, words: list[str]) -> bool:
    """Whether `memory` holds `words` in a row, compared word by word, since a decoder may join
    a full stop to the word before it."""
    have = memory.replace(".", " . ").split()
    return any(have[i:i + len(words)] == words for i in range(len(have) - len(words) + 1))


def follow(memories: list[str], fact: str, due: int) -> tuple[str, int | None]:
    """How `memories` (the agent's after each chunk, [turns]) treat `fact`, which an ideal
    memory first holds after chunk `due` (0-based) -> (outcome, turn): ("kept", due), ("late",
    the turn it first holds it), ("unwritten", None), ("lost", the turn it dropped it)."""
    held = [holds(memory, fact) for memory in memories]
    first = next((t for t in range(due, len(memories)) if held[t]), None)
    if first is None:
        return "unwritten", None
    dropped = next((t for t in range(first, len(memories)) if not held[t]), None)
    if dropped is not None:
        return "lost", dropped
    return ("kept" if first == due else "late"), first


AGE_BINS = (1, 4, 16, 64, 256, 1024, 4096)  # turns since a fact was first written: bins' starts


def losses_by_age(memories: list[str], fact: str, due: int) -> tuple[list[int], list[int]]:
    """The per-turn loss rate's counts by age ([len(AGE_BINS)] each): turns that follow one
    whose memory holds `fact`, from `due` on, binned by the turns since a memory first held it;
    of them, those whose memory no longer holds it. Every loss counted, not only `follow`'s
    first; a fact rewritten after a loss keeps its first write's age."""
    held = [holds(memory, fact) for memory in memories[due:]]
    carried, dropped = [0] * len(AGE_BINS), [0] * len(AGE_BINS)
    first = next((i for i, h in enumerate(held) if h), len(held))
    for i in range(first, len(held) - 1):
        if held[i]:
            age = bisect.bisect_right(AGE_BINS, i - first + 1) - 1
            carried[age] += 1
            dropped[age] += not held[i + 1]
    return carried, dropped


@dataclasses.dataclass
class FactTrace:
    text: str
    chunk: int         # 0-based chunk where it begins
    word: int          # where it begins in that chunk (the synthetic tokenizer: a token a word)
    due: int           # the turn after which an ideal memory first holds it
    outcome: str       # one of OUTCOMES
    turn: int | None   # `follow`'s turn
    memory: str        # the agent's memory after `turn` (after `due` when unwritten)
    made_up: int | None  # `made_up`'s turn: a value for its subject before it was read
    carried: list[int] = dataclasses.field(default_factory=list)  # `losses_by_age`'s, by age:
    dropped: list[int] = dataclasses.field(default_factory=list)  # turns after one that held
    # it, and those whose memory no longer held it


@dataclasses.dataclass
class DocumentTrace:
    index: int
    chunks: int
    correct: bool
    answer: str
    truth: str
    facts: list[FactTrace]   # the needed facts, in document order
    gates: dict[str, float] = dataclasses.field(default_factory=dict)  # the agent's metrics

    @property
    def outcome(self) -> FactTrace | None:
        """The first needed fact that was not kept; None when all were."""
        return next((f for f in self.facts if f.outcome != "kept"), None)


def trace_document(index: int, document, chunk_texts: list[str], memories: list[str],
                   answer: str, chunk_tokens: int, gates: dict | None = None) -> DocumentTrace:
    """The trace of one read: `document` (a tasks.Sample), the agent's chunks as
    decoded text, its memory after each chunk it read (after an exit, the outcomes take the
    memory it answered from for every chunk left unread; the per-turn counts, `carried` and
    `dropped`, only the turns it took), its final answer, and with gates on the rollout's
    metrics (chunks_read, keeps, exits)."""
    from memagent_jax.synthetic.tasks import find, oracle_memories

    read = memories  # the per-turn loss counts turns taken: chunks an exit left carry nothing
    memories = memories + memories[-1:] * (len(chunk_texts) - len(memories))  # after an exit
    facts = [dataclasses.asdict(f) for f in document.facts]
    ideal = oracle_memories(chunk_texts, facts)
    words = document.context.split()
    traced = []
    for fact in document.facts:
        if not fact.needed:
            continue
        start = find(words, fact.text.split())
        due = next(t for t, memory in enumerate(ideal) if fact.text in memory.splitlines())
        outcome, turn = follow(memories, fact.text, due)
        traced.append(FactTrace(fact.text, start // chunk_tokens, start % chunk_tokens, due,
                                outcome, turn, memories[due if turn is None else turn],
                                made_up(memories, fact.text, due),
                                *losses_by_age(read, fact.text, due)))
    return DocumentTrace(index, len(memories), answer == document.answer, answer,
                         document.answer, traced, dict(gates or {}))


def made_up_line(fact: FactTrace, memories: list[str]) -> str | None:
    """One line when the memory held a value for `fact`'s subject ("the code of KEY") before
    the fact was read (`made_up`): which value, from which chunk, how many chunks before the
    fact, and what the memory did once it had read it (`follow`'s outcome); None when it held
    none. The value is the word after the subject ("nothing" where the memory ends on it)."""
    if fact.made_up is None:
        return None
    subject = fact.text.split()[:4]
    held = memories[fact.made_up].replace(".", " . ").split() + ["nothing"]
    value = next(held[i + 4] for i in range(len(held) - 4) if held[i:i + 4] == subject)
    later = {"kept": "held the true value from then on",
             "late": f"held the true value from chunk {(fact.turn or 0) + 1} on",
             "unwritten": "never held the true value",
             "lost": f"held the true value, then lost it after chunk {(fact.turn or 0) + 1}",
             }[fact.outcome]
    return (f"note: from chunk {fact.made_up + 1} the memory held a made-up value for "
            f"'{' '.join(subject)}' ({value}), {fact.due - fact.made_up} chunks before its "
            f"fact was read (chunk {fact.chunk + 1}); after reading it, the memory {later}")


def made_up_lines(read) -> list[str]:
    """`made_up_line` for each needed fact of a demo's read (`demo.DemoRead`)."""
    trace = trace_document(0, read.document, read.chunk_texts, read.memories, read.answer,
                           read.chunk_tokens)
    return [line for fact in trace.facts
            if (line := made_up_line(fact, read.memories)) is not None]


def describe(trace: DocumentTrace) -> str:
    """One line: right or wrong, the outcome, where the fact was, the memory then."""
    from memagent_jax.synthetic.demo import abbreviate

    fact = trace.outcome or trace.facts[0]
    where = (f"'{fact.text}' in chunk {fact.chunk + 1}/{trace.chunks} at word {fact.word}")
    turn = "" if fact.turn is None or fact.outcome == "kept" else f" after chunk {fact.turn + 1}"
    memory = ("" if fact.outcome == "kept" else
              f"; memory after chunk {(fact.due if fact.turn is None else fact.turn) + 1}: "
              f"{abbreviate(fact.memory, 60)}")
    return (f"{trace.index:>4} {'right' if trace.correct else 'WRONG'}  {fact.outcome}{turn}: "
            f"{where}{memory}" + ("" if trace.correct else f"; answered {trace.answer!r}"))


def summarize(traces: list[DocumentTrace], chunk_tokens: int) -> list[str]:
    """The summary lines: outcomes counted, answers right, documents with a made-up value,
    where unwritten facts began."""
    counts = collections.Counter(t.outcome.outcome if t.outcome else "kept" for t in traces)
    right = sum(t.correct for t in traces)
    lines = [", ".join(f"{o} {counts[o]}" for o in OUTCOMES)
             + f"; answers right {right} of {len(traces)}"]
    invented = [t for t in traces if any(f.made_up is not None for f in t.facts)]
    lines.append(f"a value made up before its fact was read: {len(invented)} of {len(traces)} "
                 f"documents, {sum(not t.correct for t in invented)} of them answered wrong")
    facts = [f for t in traces for f in t.facts]
    written = sum(f.outcome != "unwritten" for f in facts)
    lines.append(f"needed facts written: {written} of {len(facts)} ({written / len(facts):.1%})")
    carried = [sum(c) for c in zip(*(f.carried for f in facts))]
    dropped = [sum(d) for d in zip(*(f.dropped for f in facts))]
    lines.append(f"a held fact lost in {sum(dropped)} of {sum(carried)} turns"
                 + (f" ({sum(dropped) / sum(carried):.2e} a turn)" if sum(carried) else ""))
    bins = [f"{start}-{end - 1}" for start, end in zip(AGE_BINS, AGE_BINS[1:])]
    by_age = [f"{name}: {d} of {c}" for name, c, d in zip(bins + [f"{AGE_BINS[-1]}+"],
                                                           carried, dropped) if c]
    if by_age:
        lines.append("  by turns since first written: " + "; ".join(by_age))
    if traces[0].gates:
        read = sum(t.gates["chunks_read"] for t in traces)
        lines.append(f"chunks read {read:.0f} of {sum(t.chunks for t in traces)}" + "".join(
            f"; {name} {sum(t.gates[name] for t in traces):.0f}"
            for name in ("keeps", "exits") if name in traces[0].gates))
    starts = sorted(f.word for t in traces for f in t.facts if f.outcome == "unwritten")
    if starts:
        lines.append(f"unwritten facts began at words {', '.join(map(str, starts))} of "
                     f"{chunk_tokens}")
    return lines


def read_greedily(model: str, task: str, length: int, seed: int, num_samples: int,
                  budgets: dict, slots: int, out: str | None, heading: str = ""):
    """`num_samples` documents of `task` (seed) read greedily by `model` (`demo.load_agent`),
    after checking `num_samples` and `out` (a new file) and printing a heading line (ended by
    `heading`); progress on stderr. Returns (agent, its MemAgent budgets, documents, samples,
    [one trajectory] a document). `trace` and `trace --selection` read through it."""
    from memagent_jax.console import progress_bar
    from memagent_jax.engine.sampling import SamplingParams
    from memagent_jax.errors import UserError
    from memagent_jax.fileutil import check_output_file
    from memagent_jax.synthetic import tasks as synthetic
    from memagent_jax.synthetic.demo import load_agent

    if num_samples < 1:
        raise UserError(f"--num-samples must be at least 1, got {num_samples}")
    if out:
        check_output_file(out)
    _, rollouts, agent, config = load_agent(model, task, length, budgets, slots)
    documents = [synthetic.make_sample(task, length, seed, i) for i in range(num_samples)]
    samples = [agent.read(d.question, d.context) for d in documents]
    print(f"{num_samples} {task} documents of {length:,} tokens (seed {seed}), read "
          f"{config.chunk_tokens} tokens a turn by {model}{heading}")
    with progress_bar(total=sum(len(s.chunks) + 1 for s in samples), desc="reading",
                      unit="turn") as bar:
        groups = rollouts.run(agent, samples, SamplingParams(0.0),
                              on_call=lambda _row: bar.update(1))
    return agent, config, documents, samples, [trajectory for (trajectory,) in groups]


def write_records(out: str | None, records: list[dict]) -> None:
    """`records` as JSON lines to `out` when given, by process 0 only (every process of a job
    reads the same documents)."""
    from memagent_jax.distributed import collectives
    from memagent_jax.fileutil import atomic_file

    if out and collectives.is_main():
        with atomic_file(out) as tmp, open(tmp, "w") as f:
            f.writelines(json.dumps(record) + "\n" for record in records)


def run_trace(model: str, task: str, length: int, seed: int, num_samples: int,
              budgets: dict, slots: int, out: str | None = None) -> list[DocumentTrace]:
    """Reads the documents, prints a line each and the summary (progress on stderr); writes
    the traces as JSON lines to `out` when given (process 0 of a multi-process job)."""
    from memagent_jax.agents.memagent.agent import memories_of

    agent, config, documents, samples, trajectories = read_greedily(
        model, task, length, seed, num_samples, budgets, slots, out)
    traces = []
    for index, (trajectory, document, sample) in enumerate(
            zip(trajectories, documents, samples)):
        traces.append(trace_document(
            index, document, [agent.tokenizer.decode(c) for c in sample.chunks],
            memories_of(trajectory), (trajectory.answer or "").strip(), config.chunk_tokens,
            trajectory.metrics))
        print(describe(traces[-1]))
    for line in summarize(traces, config.chunk_tokens):
        print(line)
    write_records(out, [dataclasses.asdict(t) for t in traces])
    return traces
