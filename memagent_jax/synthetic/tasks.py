"""Synthetic long-document tasks, for training and evaluating a small memory agent from scratch.

A document is sentences of made-up words (a fixed vocabulary of a few thousand: nouns, verbs
and adjectives in a handful of sentence patterns, so that it reads like text rather than one
repeated sentence) with a few fact sentences placed at random depths, anywhere from the first
token to the last. The word-level tokenizer (`vocabulary`, written by `needle.write_tokenizer`)
makes every word and punctuation mark one token, so a document of `length` tokens is exactly
that long in the model's tokens.

Tasks (the question is asked about one of several facts of the same form):
- multikey: "the code of KEY VALUE ." for 4 keys; "what is the code of KEY ?" -> VALUE.
- twohop: "the city of PERSON CITY ." for 3 people and "the code of CITY VALUE ." for 3 cities;
  "what is the code of the city of PERSON ?" -> VALUE. The two facts the answer needs
  lie in different halves of the document, in either order: when the city's code comes first,
  a reader must keep every city's code until it learns which city matters.

A fact's value follows its key with no word between: a reader finds it as the word after the
key, the lookup a model that copies by matching words makes first.

Each sample records its facts in document order (`facts`, each with the kind of fact and
whether the answer needs it), from which `oracle_memories` derives what an ideal memory holds
after each chunk (supervised warm-up). Everything is deterministic by (task, length, seed,
index).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import random
from collections.abc import Callable

from memagent_jax.hostmemory import available_memory  # check_memory's (tests replace it here)

TASKS = ("multikey", "twohop")
# `make_sample`'s poll comes after every POLL_TOKENS tokens built: about 20 ms at the 3M
# tokens a second a 2-core CPU builds.
POLL_TOKENS = 1 << 16
KEYS_PER_DOCUMENT = {"multikey": 4, "twohop": 3}

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_FUNCTION_WORDS = ("the", "a", "of", "in", "near", "with", "and", "by", "is", "code", "what",
                   "city", "?", ".")
_PATTERNS = ("the A N V the N .", "a N V near the A N .", "the N of the N V with a N .",
             "A N and A N V by the N .", "the A A N V in the N .")


@dataclasses.dataclass(frozen=True)
class Words:
    """The task's word classes, disjoint: filler (nouns, verbs, adjectives; two syllables)
    and the fact slots (keys, people, cities, values; three syllables)."""
    nouns: tuple[str, ...]
    verbs: tuple[str, ...]
    adjectives: tuple[str, ...]
    keys: tuple[str, ...]
    people: tuple[str, ...]
    cities: tuple[str, ...]
    values: tuple[str, ...]

    def all(self) -> list[str]:
        return [*_FUNCTION_WORDS, *self.nouns, *self.verbs, *self.adjectives, *self.keys,
                *self.people, *self.cities, *self.values]


@functools.lru_cache(maxsize=1)
def words() -> Words:
    """The fixed vocabulary (the same on every call: it defines the tokenizer)."""
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    rng = random.Random(0)
    two = ["".join(p) for p in itertools.product(syllables, repeat=2)]
    three = ["".join(p) for p in itertools.product(syllables, repeat=3)]
    rng.shuffle(two)
    three = rng.sample(three, 1500)
    return Words(nouns=tuple(two[:1200]), verbs=tuple(two[1200:1800]),
                 adjectives=tuple(two[1800:2400]), keys=tuple(three[:400]),
                 people=tuple(three[400:800]), cities=tuple(three[800:1000]),
                 values=tuple(three[1000:1500]))


def vocabulary() -> list[str]:
    """The tokenizer's words: the templates' and the answer format's (`needle.vocabulary`),
    then this module's, then the words of the gates' sentences (`memagent.keep_gate`,
    `exit_gate`: templates.GATE_SENTENCES) not among them. Those come last, so that every
    earlier word keeps the id the committed models were trained with (3,969 words before them;
    the `small` preset has 4,096 embedding rows)."""
    from memagent_jax.agents.memagent.templates import GATE_SENTENCES
    from memagent_jax.data.needle import vocabulary as base
    return base([*words().all(), *GATE_SENTENCES.values()])


CODE_FACT = "the code of {} {} ."   # a key's or a city's code
CITY_FACT = "the city of {} {} ."   # a person's city (twohop's bridge)


@dataclasses.dataclass(frozen=True)
class Fact:
    text: str
    kind: str        # "code" (CODE_FACT) or "lives" (CITY_FACT: where a person lives)
    needed: bool     # whether the answer needs it


@dataclasses.dataclass(frozen=True)
class Sample:
    context: str
    question: str
    answer: str
    facts: tuple[Fact, ...]   # in document order


def check_task(task: str) -> None:
    from memagent_jax.errors import UserError
    if task not in TASKS:
        raise UserError(f"unknown synthetic task '{task}' (known: {', '.join(TASKS)})")


def min_length(task: str) -> int:
    """The fewest tokens a document of `task` holds: its facts and one filler sentence."""
    return {"multikey": 4 * 6, "twohop": 3 * 6 + 3 * 6}[task] + 8


def check_memory(what: str, needed: int) -> None:
    """Raises UserError, `what` (the flags at fault and why their work takes memory) then the
    figures, when `needed` bytes are more than `available_memory()`: refused at once, not
    minutes later by the system killing the process (or paging until nothing answers)."""
    available = available_memory()
    if available is not None and needed > available:
        from memagent_jax.errors import UserError
        raise UserError(f"{what}: about {needed / 2 ** 30:,.1f} GiB of memory, and this "
                        f"machine has {available / 2 ** 30:,.1f} GiB available")


def make_sample(task: str, length: int, seed: int, index: int,
                poll: Callable[[], None] | None = None) -> Sample:
    """Sample `index` of (task, length, seed): a document of exactly `length` tokens.
    poll: called after every POLL_TOKENS tokens built (a long document takes minutes), where
    a command checks for a stop and raises."""
    check_task(task)
    rng = random.Random(f"{task}:{length}:{seed}:{index}")
    w = words()
    if task == "multikey":
        keys = rng.sample(w.keys, KEYS_PER_DOCUMENT[task])
        values = rng.sample(w.values, len(keys))
        asked = rng.randrange(len(keys))
        facts = [Fact(CODE_FACT.format(k, v), "code", i == asked)
                 for i, (k, v) in enumerate(zip(keys, values))]
        depths = [rng.random() for _ in facts]
        question, answer = f"what is the code of {keys[asked]} ?", values[asked]
    else:
        n = KEYS_PER_DOCUMENT[task]
        people, cities = rng.sample(w.people, n), rng.sample(w.cities, n)
        values = rng.sample(w.values, n)
        asked = rng.randrange(n)
        lives = [Fact(CITY_FACT.format(p, c), "lives", i == asked)
                 for i, (p, c) in enumerate(zip(people, cities))]
        codes = [Fact(CODE_FACT.format(c, v), "code", i == asked)
                 for i, (c, v) in enumerate(zip(cities, values))]
        facts = lives + codes
        depths = [rng.random() for _ in facts]
        # The two facts the answer needs: one in each half, either first.
        early, late = rng.uniform(0, 0.5), rng.uniform(0.5, 1)
        if rng.random() < 0.5:
            early, late = late, early
        depths[asked], depths[n + asked] = early, late
        question = f"what is the code of the city of {people[asked]} ?"
        answer = values[asked]
    return document(rng, w, facts, depths, length, question, answer, poll)


def fact_at_chunk_end(sample: Sample, chunk_tokens: int, window: int, seed: int,
                      index: int) -> Sample:
    """`sample` with the last fact its answer needs moved, as a whole sentence, so that its
    full stop is among the last `window` tokens of a chunk of `chunk_tokens` (the place where
    the recipe's models most often fail to read a fact), in the chunk it was in, or in a chunk
    after the first drawn by (seed, index) if it was in the first. The document's length and
    its other sentences are unchanged; `facts` stays in document order."""
    tokens = sample.context.split()
    check_chunk_end(len(tokens), chunk_tokens, window)
    chunks = len(tokens) // chunk_tokens
    rng = random.Random(f"chunk-end:{seed}:{index}")
    moved = [f for f in sample.facts if f.needed][-1]
    words_ = moved.text.split()
    start = find(tokens, words_)
    rest = tokens[:start] + tokens[start + len(words_):]
    chunk = start // chunk_tokens or rng.randrange(1, chunks)
    # Sentence boundaries of the rest (after a full stop) at which the fact, inserted whole,
    # ends in the window (filler sentences are at most 10 tokens, so there is one), and after
    # the other facts the answer needs, so that it stays the last; unless one of those ends
    # the chunk itself (twohop, both in one chunk: rare), when it goes before it.
    last = (chunk + 1) * chunk_tokens - 1
    after = max((find(rest, f.text.split()) + len(f.text.split())
                 for f in sample.facts if f.needed and f is not moved), default=0)
    within = [b for b in range(last - window - len(words_) + 2, last - len(words_) + 2)
              if rest[b - 1] == "."]
    boundaries = [b for b in within if b >= after] or within
    at = rng.choice(boundaries)
    context = " ".join(rest[:at] + words_ + rest[at:])
    order = sorted(sample.facts, key=lambda f: context.index(f.text))  # texts are unique
    return dataclasses.replace(sample, context=context, facts=tuple(order))


def check_chunk_end(length: int, chunk_tokens: int, window: int) -> None:
    """Raises UserError unless `fact_at_chunk_end` can place a fact in documents of `length`
    tokens: whole chunks, two at least, and a window that always holds a sentence boundary."""
    from memagent_jax.errors import UserError
    if chunk_tokens <= 0:
        raise UserError(f"--chunk-tokens must be positive, got {chunk_tokens}")
    if length % chunk_tokens or length < 2 * chunk_tokens:
        raise UserError(f"--fact-at-chunk-end: a document of {length} tokens is not two or "
                        f"more whole chunks of {chunk_tokens} tokens")
    if not 10 <= window <= chunk_tokens // 2:
        raise UserError(f"--fact-at-chunk-end {window}: the window must be 10 tokens (the "
                        f"longest filler sentence) to {chunk_tokens // 2} (half a chunk, so "
                        "that the fact stays whole in its chunk)")


def find(tokens: list[str], words_: list[str]) -> int:
    """The first index at which `words_` occur in `tokens` (a fact's text, unique in its
    document: its key is)."""
    first = words_[0]
    for i, token in enumerate(tokens):
        if token == first and tokens[i:i + len(words_)] == words_:
            return i
    raise ValueError(f"{' '.join(words_)!r} is not in the document")


def sample_of(question: str, context: str, answer: str) -> Sample:
    """The Sample a document of `make_sample`'s stands for, from its text alone (an
    `eval_record`'s input, context and answer): its fact sentences in document order, each
    needed as `make_sample` marks it (multikey: the asked key's code; twohop: the person's
    city and that city's code). No filler sentence reads "the code of" or "the city of" (code
    and city are function words, never a pattern's noun)."""
    tokens, asked = context.split(), question.split()[5:-1]   # "what is the code of ... ?"
    found = [(tokens[i + 1], tokens[i + 3], tokens[i + 4]) for i in range(len(tokens) - 5)
             if tokens[i] == "the" and tokens[i + 1] in ("code", "city")
             and tokens[i + 2] == "of" and tokens[i + 5] == "."]
    person = asked[3] if asked[:3] == ["the", "city", "of"] else None
    cities = {value for kind, subject, value in found if kind == "city" and subject == person}
    facts = tuple(
        Fact(CODE_FACT.format(subject, value), "code",
             subject in (cities if person else set(asked)))
        if kind == "code" else
        Fact(CITY_FACT.format(subject, value), "lives", subject == person)
        for kind, subject, value in found)
    return Sample(context, question, answer, facts)


def filler_text(length: int, seed: int, index: int) -> str:
    """Text `index` of (length, seed): `length` tokens of the documents' filler sentences and
    no fact."""
    return document(random.Random(f"filler:{length}:{seed}:{index}"), words(), [], [], length,
                     "", "").context


def distractor_text(length: int, fact: str, seed: int, index: int) -> str:
    """Text `index` of (length, fact, seed): `length` tokens of the documents' filler sentences
    and, at a random depth, one distractor of `fact` ("the code of KEY VALUE ." or "the city
    of PERSON CITY ."): a fact of its form whose subject and object are other words of their
    classes, which a memory that holds `fact` reads past without taking."""
    w = words()
    *form, subject, value, stop = fact.split()
    rng = random.Random(f"distractor:{length}:{fact}:{seed}:{index}")
    other = [rng.choice([x for x in _word_class(w, word) if x != word])
             for word in (subject, value)]
    distractor = Fact(" ".join([*form, *other, stop]), "lives" if form[1] == "city" else "code",
                      False)
    return document(rng, w, [distractor], [rng.random()], length, "", "").context


def _word_class(w: Words, word: str) -> tuple[str, ...]:
    """The fact slot's words `word` is one of (keys, people, cities or values)."""
    return next(c for c in (w.keys, w.people, w.cities, w.values) if word in c)


def document(rng, w: Words, facts: list[Fact], depths: list[float], length: int,
             question: str, answer: str, poll: Callable[[], None] | None = None) -> Sample:
    """A document of `length` words: filler sentences drawn with `rng`, each fact between
    them at its depth (0 opens the document, 1 closes it); the sample asks `question`,
    answered `answer`. poll() every POLL_TOKENS filler words (a job's Ctrl-C check)."""
    fact_tokens = sum(len(f.text.split()) for f in facts)
    if length < fact_tokens + 1:
        from memagent_jax.errors import UserError
        raise UserError(f"a document of {length} tokens cannot hold its facts "
                        f"({fact_tokens} tokens)")
    # Each sentence is kept as text, not as a list of words: a third of the memory (17 bytes a
    # token at the peak, the joined document included, against 51) and 2.5 times as fast,
    # the join below going over sentences, not words; the text is the same.
    sentences, filler = [], length - fact_tokens
    while filler > 0:
        sentence = _sentence(rng, w)
        if len(sentence) > filler:  # the last one cut to fit, still ending in a full stop
            sentence = sentence[:filler - 1] + ["."]
        sentences.append(" ".join(sentence))
        if poll is not None and (filler - len(sentence)) // POLL_TOKENS < filler // POLL_TOKENS:
            poll()  # at points set by the length alone: the same on every process of a job
        filler -= len(sentence)
    # Fact i goes before filler sentence round(depth * count): depth 0 opens the document,
    # depth 1 closes it. In depth order the slots never decrease, so slices of the filler
    # between them place every fact.
    order = sorted(range(len(facts)), key=lambda i: depths[i])
    placed: list[str] = []
    previous = 0
    for i in order:
        slot = round(depths[i] * len(sentences))
        placed += sentences[previous:slot]
        placed.append(facts[i].text)
        previous = slot
    placed += sentences[previous:]
    return Sample(" ".join(placed), question, answer, tuple(facts[i] for i in order))


def _sentence(rng, w: Words) -> list[str]:
    pick = {"A": w.adjectives, "N": w.nouns, "V": w.verbs}
    return [rng.choice(pick[t]) if t in pick else t for t in rng.choice(_PATTERNS).split()]


def eval_record(sample: Sample, task: str, length: int, index: int) -> dict:
    """The record `memagent-jax eval` reads (RULER-HQA's fields, with `length` for the
    column's label instead of num_docs)."""
    return {"context": sample.context, "input": sample.question, "answers": [sample.answer],
            "length": length, "synthetic_task": task, "index": index}


def train_row(sample: Sample, task: str, length: int, index: int) -> dict:
    """The training layout (BytedTsinghua-SIA/hotpotqa's, as `needle.needle_rows`), with the
    facts for the supervised warm-up's oracle memories."""
    return {
        "data_source": f"synthetic_{task}",
        "prompt": [{"role": "user", "content": sample.question}],
        "context": sample.context,
        "reward_model": {"ground_truth": [sample.answer], "style": "rule"},
        "extra_info": {"index": index, "question": sample.question, "num_docs": 1,
                       "length": length,
                       "facts": [dataclasses.asdict(f) for f in sample.facts]},
    }


def oracle_memories(chunks: list[str], facts: list[dict]) -> list[str]:
    """What an ideal memory holds after each chunk: the facts read so far that bear on the
    question. That is the needed facts, and, until the reader has met the needed "lives" fact
    (twohop), every city's code, since any may turn out to be the one asked for. Facts are
    kept in document order, one per line; "" when none was read yet. chunks: the document's
    chunks as text, spaced as any decoder spaces them."""
    two_hop = any(f["kind"] == "lives" for f in facts)
    memories, seen, tail = [], set(), ""
    for chunk in chunks:
        # Compared without spaces: a decoder may join "v ." as "v."; and a fact cut by a chunk
        # boundary is whole in the next window.
        window = tail + "".join(chunk.split())
        seen |= {f["text"] for f in facts if "".join(f["text"].split()) in window}
        tail = window[-200:]
        bridge_known = any(f["needed"] and f["kind"] == "lives" and f["text"] in seen
                           for f in facts)
        memories.append("\n".join(
            f["text"] for f in facts if f["text"] in seen and (
                f["needed"] or (two_hop and f["kind"] == "code" and not bridge_known))))
    return memories
