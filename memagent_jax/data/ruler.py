"""RULER synthetic tasks (docs/algorithm.md section 4) at target lengths in tokens.

Each task is RULER's configuration of it:
  niah_single_1    noise haystack; one needle, key words -> value numbers
  niah_single_2    essay haystack; words -> numbers
  niah_single_3    essay haystack; words -> uuids
  niah_multikey_1  essay haystack; 4 keys inserted, 1 asked
  niah_multikey_2  haystack made of distractor needles; words -> numbers
  niah_multikey_3  haystack made of distractor needles; uuids -> uuids
  niah_multivalue  essay haystack; one key with 4 values, all asked
  niah_multiquery  essay haystack; 4 keys, all asked
  vt               variable tracking: one chain of 4 hops (5 variables) in the noise haystack
  fwe              frequent words extraction: coded words drawn Zipf(alpha=2); the 3 most
                   frequent (the top one, "...", is noise)
A needle reads "One of the special magic numbers for KEY is: VALUE." (RULER's wording). The
"essay" haystack is text the caller supplies (RULER uses Paul Graham's essays, which are not
redistributed here), cut into sentences and repeated as needed.

A record is {context, input (the question), answers, task, length (the target), tokens (the
context's length in the given tokenizer's tokens, within +-5% of the target), index}; the
question goes to the memory agent as its problem, the context as its document. Everything is
drawn from random.Random(f"{seed}/{task}/{length}/{index}"): deterministic by seed.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
import string
import uuid
from collections.abc import Callable, Iterator

from memagent_jax.errors import UserError

TOLERANCE = 0.05        # the promise: context tokens within 5% of the target
_AIM = 0.01             # what the fit tries for before settling for TOLERANCE
_NOISE = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.",
          "There and back again.")
_FWE_ALPHA, _FWE_VOCAB, _FWE_WORD_LEN = 2.0, 2000, 6
_ADJECTIVES = """able acid agile airy alert amber ample ancient angry arctic ashen avid bald
balmy bare beige bitter bland bleak blue bold brave brief brisk broad bronze busy calm candid
cheap chilly civil clean clear clever coarse cold cool coral cosy crisp cruel curly damp dark
deep dense dim dizzy dry dull dusty eager early easy elder empty equal even exact faint fancy
fast fierce firm flat fond frail free fresh frosty full fuzzy gentle giant glad glossy golden
grand grave great green grim gross hairy happy hard harsh hasty heavy hollow honest huge humble
icy idle jolly keen kind large lazy lean light lively livid long loud lucky lush mad mellow
merry mild misty modest moist narrow neat noble noisy odd oily old orange pale plain plump
polite proud pure quick quiet rapid rare raw red rich rigid ripe rough round royal rude rusty
sad safe salty sandy sharp shiny short shy silent silky silver simple slim slow small smooth
soft solid sour spare stale steep stiff stout strict strong sunny sweet swift tall tame tart
tender thick thin tidy tiny tough tricky vast violet vivid warm weak wet white wide wild wise
witty young zesty""".split()
_NOUNS = """acorn anchor apple arrow badge bagel ball banjo barn basket beacon bell bench
berry bison blade blanket boat bolt bottle boulder bridge brook brush bucket button cabin cable
camel candle canoe canyon carpet castle cedar chalk cherry chimney cloud clover comet copper
cottage crane crow crystal cup curtain daisy desert dolphin donkey dragon drum eagle easel
ember engine falcon feather fern fiddle field flame flute forest fossil fountain fox garden
garnet giraffe glacier goat harbor harp hawk hazel helmet heron hill honey horse island ivory
jacket jaguar jasmine kettle kite ladder lagoon lantern lemon lily lizard locket lotus magnet
maple marble meadow mirror mitten moose moth needle nest oak ocean olive otter owl paddle
panda parrot pearl pebble pepper piano pigeon pillow pine planet plum pond poppy quill rabbit
raven reef ribbon river robin rocket saddle salmon sparrow spider spoon squirrel stone
stream sunset swan teapot thistle tiger timber tulip turtle valley violin walnut whale willow
window wolf zebra""".split()


@dataclasses.dataclass(frozen=True)
class NiahSpec:
    haystack: str            # "noise" | "essay" | "needle"
    key_type: str = "words"  # "words" | "uuids"
    value_type: str = "numbers"  # "numbers" | "uuids"
    keys: int = 1            # keys inserted
    values: int = 1          # needles (values) per key
    queries: int = 1         # keys asked about


NIAH = {
    "niah_single_1": NiahSpec("noise"),
    "niah_single_2": NiahSpec("essay"),
    "niah_single_3": NiahSpec("essay", value_type="uuids"),
    "niah_multikey_1": NiahSpec("essay", keys=4),
    "niah_multikey_2": NiahSpec("needle"),
    "niah_multikey_3": NiahSpec("needle", key_type="uuids", value_type="uuids"),
    "niah_multivalue": NiahSpec("essay", values=4),
    "niah_multiquery": NiahSpec("essay", keys=4, queries=4),
}
TASKS = tuple(NIAH) + ("vt", "fwe")


def check_task(task: str) -> None:
    if task not in TASKS:
        raise UserError(f"unknown task '{task}' (known: {', '.join(TASKS)})")


def needs_essay(task: str) -> bool:
    return task in NIAH and NIAH[task].haystack == "essay"


def essay_sentences(text: str) -> list[str]:
    """The essay haystack's units: its sentences, whitespace collapsed."""
    return [s for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if s]


@dataclasses.dataclass
class _Plan:
    """A sample before its length is fixed: filler(n) gives n haystack units; needles go in
    at the fractional depths (in order); units are joined by `joiner`."""
    filler: Callable[[int], list[str]]
    needles: list[str]
    depths: list[float]
    joiner: str
    question: str
    answers: list[str]
    check: Callable[[int], None] = lambda n: None  # raises when n units cannot be valid

    def compose(self, n: int) -> str:
        units = self.filler(n)
        for offset, (needle, depth) in enumerate(zip(self.needles, self.depths)):
            units.insert(round(depth * n) + offset, needle)
        return self.joiner.join(units)


def _key(rng: random.Random, kind: str) -> str:
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"


def _value(rng: random.Random, kind: str) -> str:
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return str(rng.randint(1_000_000, 9_999_999))


def _needle(key: str, value: str, value_type: str) -> str:
    return f"One of the special magic {value_type} for {key} is: {value}."


def _cycle(units: list[str]) -> Callable[[int], list[str]]:
    return lambda n: [units[i % len(units)] for i in range(n)]


def _niah_plan(spec: NiahSpec, rng: random.Random, essay: list[str] | None) -> _Plan:
    keys: list[str] = []
    while len(keys) < spec.keys:
        key = _key(rng, spec.key_type)
        if key not in keys:
            keys.append(key)
    values = {k: [_value(rng, spec.value_type) for _ in range(spec.values)] for k in keys}
    needles = [_needle(k, v, spec.value_type) for k in keys for v in values[k]]
    rng.shuffle(needles)
    asked = keys[:spec.queries]
    query = asked[0] if len(asked) == 1 else ", ".join(asked[:-1]) + ", and " + asked[-1]
    question = (f"What are all the special magic {spec.value_type} for {query} mentioned in "
                "the provided text?")
    filler: Callable[[int], list[str]]
    if spec.haystack == "needle":
        distractors: list[str] = []
        distractor_rng = random.Random(rng.getrandbits(64))

        def grow(n: int) -> list[str]:
            while len(distractors) < n:  # one lazily grown, deterministic sequence
                key = _key(distractor_rng, spec.key_type)
                if key not in keys:
                    distractors.append(_needle(key, _value(distractor_rng, spec.value_type),
                                               spec.value_type))
            return distractors[:n]
        filler = grow
    else:
        units = list(_NOISE) if spec.haystack == "noise" else essay
        assert units is not None  # an essay task's caller gives its essay (`ruler_records`)
        filler = _cycle(units)
    return _Plan(filler, needles, [rng.random() for _ in needles],
                 "\n" if spec.haystack == "needle" else " ", question,
                 [v for k in asked for v in values[k]])


def _vt_plan(rng: random.Random, hops: int = 4) -> _Plan:
    names: list[str] = []
    while len(names) < hops + 1:
        name = "".join(rng.choice(string.ascii_uppercase) for _ in range(5))
        if name not in names:
            names.append(name)
    value = str(rng.randint(10_000, 99_999))
    statements = [f"VAR {names[0]} = {value}."] + [
        f"VAR {names[i + 1]} = VAR {names[i]}." for i in range(hops)]
    question = f"Find all variables that are assigned the value {value} in the text."
    # Sorted depths keep the chain in reading order, as RULER inserts it.
    return _Plan(_cycle(list(_NOISE)), statements, sorted(rng.random() for _ in statements),
                 " ", question, names)


def _fwe_plan(rng: random.Random) -> _Plan:
    vocab: set[str] = set()
    while len(vocab) < _FWE_VOCAB:
        vocab.add("".join(rng.choice(string.ascii_lowercase) for _ in range(_FWE_WORD_LEN)))
    words = sorted(vocab)
    rng.shuffle(words)
    words[0] = "..."  # the most frequent word is noise, as RULER
    zeta = math.pi ** 2 / 6  # zeta(2): the Zipf normaliser for alpha = 2
    shuffle_seed = rng.getrandbits(64)

    def counts(n: int) -> list[int]:
        return [int(n * k ** -_FWE_ALPHA / zeta) for k in range(1, len(words) + 1)]

    def filler(n: int) -> list[str]:
        text = [w for w, c in zip(words, counts(n)) for _ in range(c)]
        random.Random(shuffle_seed).shuffle(text)
        return text

    def check(n: int) -> None:
        c = counts(n)
        if c[3] <= c[4]:
            raise UserError("fwe: the target length is too short for three distinct most "
                            f"frequent words ({c[1]}, {c[2]}, {c[3]} vs {c[4]} occurrences)")

    question = ("Read the coded text and track the frequency of each coded word. What are the "
                "three most frequently appeared coded words in the text? Please ignore the "
                "dots '....'.")
    return _Plan(filler, [], [], " ", question, words[1:4], check)


def _plan(task: str, rng: random.Random, essay: list[str] | None) -> _Plan:
    if task == "vt":
        return _vt_plan(rng)
    if task == "fwe":
        return _fwe_plan(rng)
    return _niah_plan(NIAH[task], rng, essay)


def _fit(plan: _Plan, count: Callable[[str], int], target: int, task: str) -> tuple[str, int]:
    """The context whose token count is nearest the target: n from the per-unit rate, then
    corrected a few times (tokens are near linear in n; merges at joins make it inexact)."""
    probe = 256
    fixed = count(plan.joiner.join(plan.needles)) if plan.needles else 0
    rate = max(count(plan.joiner.join(plan.filler(probe))) / probe, 1e-3)
    if fixed > target * (1 + TOLERANCE):
        raise UserError(f"{task}: a length of {target} tokens is too short; the needles alone "
                        f"take {fixed}")
    n = max(1, round((target - fixed) / rate))
    best: tuple[int, str, int] | None = None
    for _ in range(8):
        text = plan.compose(n)
        tokens = count(text)
        if best is None or abs(tokens - target) < abs(best[2] - target):
            best = (n, text, tokens)
        if abs(tokens - target) <= _AIM * target:
            break
        step = round((target - tokens) / rate)
        n = max(1, n + (step or (1 if tokens < target else -1)))
    assert best is not None  # the loop ran
    n, text, tokens = best
    if abs(tokens - target) > TOLERANCE * target:
        raise UserError(f"{task}: cannot build a context of {target} tokens (+-5%) from "
                        f"units of ~{rate:.0f} tokens: the nearest has {tokens}")
    plan.check(n)
    return text, tokens


def ruler_records(task: str, length: int, num_samples: int, tokenizer, seed: int = 0,
                  haystack_text: str | None = None) -> Iterator[dict]:
    """num_samples records of `task` whose contexts have `length` tokens (+-5%) in
    `tokenizer`; see the module docstring for the fields."""
    check_task(task)
    if length <= 0 or num_samples <= 0:
        raise UserError(f"{task}: length and number of samples must be positive")
    essay = None
    if needs_essay(task):
        essay = essay_sentences(haystack_text or "")
        if not essay:
            raise UserError(f"task {task} needs an essay haystack: pass a text file "
                            "(RULER uses Paul Graham's essays)")

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    for index in range(num_samples):
        rng = random.Random(f"{seed}/{task}/{length}/{index}")
        plan = _plan(task, rng, essay)
        context, tokens = _fit(plan, count, length, task)
        yield {"context": context, "input": plan.question, "answers": plan.answers,
               "task": task, "length": length, "tokens": tokens, "index": index}


def length_label(tokens: int) -> str:
    """8192 -> "8K", 1048576 -> "1M" (RULER's lengths are powers of two)."""
    for size, unit in ((1 << 20, "M"), (1 << 10, "K")):
        if tokens >= size and tokens % size == 0:
            return f"{tokens // size}{unit}"
    return str(tokens)
