"""HotpotQA -> RULER-HQA evaluation sets and MemAgent training sets (docs/algorithm.md 4).

Source rows are HotpotQA's distractor setting in either layout:
- the official JSON: {"question", "answer", "context": [[title, [sentence, ...]], ...]};
- the hub's `hotpotqa/hotpot_qa`: "context" = {"title": [...], "sentences": [[...], ...]}.

Construction, as the original's RULER-derived scripts:
- a document is f"{title}\\n{''.join(sentences)}"; the corpus is the SORTED set of distinct
  documents of the whole source (so document ids do not depend on row order);
- a sample with N documents = its own paragraphs (2 gold + 8 distractors) plus N - len(own)
  other corpus documents drawn at random (N = corpus size: every document);
- that list is shuffled with random.Random(shuffle_seed), the SAME seed for every sample as in
  the original (so at a given N the own paragraphs sit at the same positions in all samples);
- context = "\\n\\n".join(f"Document {i}:\\n{doc}"), i counting from 1.
Deliberate difference: the other documents of sample `index` are drawn with
random.Random(f"{seed}/{N}/{index}"), so a sample depends only on (seed, N, index). The
original drew from one global generator inside a thread pool, which no seed reproduces.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator

from memagent_jax.errors import UserError

# docs/algorithm.md section 4: documents per sample -> the context length the paper reports.
LENGTH_LABELS = {50: "7K", 100: "14K", 200: "28K", 400: "56K", 800: "112K", 1600: "224K",
                 3200: "448K", 6400: "896K", 12800: "1.75M", 25600: "3.5M"}
NOMINAL_TOKENS = {n: int(float(label[:-1]) * (1e3 if label[-1] == "K" else 1e6))
                  for n, label in LENGTH_LABELS.items()}
DEFAULT_SHUFFLE_SEED = 4   # the original's random.Random(4)
DEFAULT_SEED = 42          # the original's random.seed(42)


@dataclasses.dataclass(frozen=True)
class Question:
    """One source row: the question, its answers, and its own paragraphs as corpus ids."""
    question: str
    answers: tuple[str, ...]
    doc_ids: tuple[int, ...]


@dataclasses.dataclass
class Corpus:
    """questions[i] is source row i; documents is the sorted list of distinct documents."""
    questions: list[Question]
    documents: list[str]
    source: str


def document_text(title: str, sentences: list[str]) -> str:
    return f"{title}\n{''.join(sentences)}"


def read_corpus(rows, source: str) -> Corpus:
    """Checks every row (errors name the row and the field) and builds the corpus. `rows`
    iterates dicts, e.g. a `datasets.Dataset` (missing fields read as None there)."""
    parsed = []
    for i, row in enumerate(rows):
        where = f"{source}: row {i}"
        for name in ("question", "answer", "context"):
            if row.get(name) is None:
                raise UserError(f"{where}: missing field '{name}'")
        if not isinstance(row["question"], str) or not row["question"].strip():
            raise UserError(f"{where}: field 'question' must be a non-empty string")
        if not isinstance(row["answer"], str):
            raise UserError(f"{where}: field 'answer' must be a string, "
                            f"got {type(row['answer']).__name__}")
        parsed.append((row["question"], row["answer"], _paragraphs(row["context"], where)))
    if not parsed:
        raise UserError(f"{source}: no rows")
    documents = sorted({document_text(t, s) for _, _, paragraphs in parsed for t, s in paragraphs})
    ids = {doc: i for i, doc in enumerate(documents)}
    questions = [Question(q, (a,), tuple(ids[document_text(t, s)] for t, s in paragraphs))
                 for q, a, paragraphs in parsed]
    return Corpus(questions, documents, source)


def _paragraphs(context, where: str) -> list[tuple[str, list[str]]]:
    """[(title, sentences)] from either source layout."""
    if isinstance(context, dict):  # hub layout: parallel lists
        titles, sentences = context.get("title"), context.get("sentences")
        if titles is None or sentences is None:
            raise UserError(f"{where}: field 'context' lacks 'title' or 'sentences'")
        pairs = list(zip(titles, sentences))
        if len(titles) != len(sentences):
            raise UserError(f"{where}: field 'context' has {len(titles)} titles but "
                            f"{len(sentences)} sentence lists")
    elif isinstance(context, list):
        pairs = context
    else:
        raise UserError(f"{where}: field 'context' must be a list of [title, sentences]")
    out = []
    for pair in pairs:
        if (not isinstance(pair, (list, tuple)) or len(pair) != 2 or not isinstance(pair[0], str)
                or not isinstance(pair[1], list) or not all(isinstance(s, str) for s in pair[1])):
            raise UserError(f"{where}: field 'context' must hold [title, [sentence, ...]] "
                            f"pairs, got {str(pair)[:60]}")
        out.append((pair[0], pair[1]))
    if not out:
        raise UserError(f"{where}: field 'context' is empty")
    return out


def select_questions(corpus: Corpus, num_samples: int | None = None,
                     indices: list[int] | None = None) -> list[int]:
    """Source rows to build samples from: `indices` if given, else the first num_samples
    (all when None). The same questions at every N, so lengths are comparable."""
    count = len(corpus.questions)
    if indices is None:
        if num_samples is not None and not 0 < num_samples <= count:
            raise UserError(f"{num_samples} samples asked; {corpus.source} has {count} questions")
        return list(range(count if num_samples is None else num_samples))
    bad = [i for i in indices if not 0 <= i < count]
    if bad:
        raise UserError(f"question index {bad[0]} is out of range: {corpus.source} has "
                        f"{count} questions")
    return list(indices[:num_samples] if num_samples else indices)


def check_num_docs(corpus: Corpus, num_docs: int, indices: list[int]) -> None:
    """Raises UserError unless every selected sample can have num_docs documents."""
    available = len(corpus.documents)
    if num_docs > available:
        raise UserError(f"{num_docs} documents per sample asked, but {corpus.source} has only "
                        f"{available} distinct documents")
    for index in indices:
        own = len(corpus.questions[index].doc_ids)
        if num_docs < own:
            raise UserError(f"{num_docs} documents per sample is fewer than row {index}'s own "
                            f"{own} paragraphs")


def sample_documents(corpus: Corpus, index: int, num_docs: int, seed: int,
                     shuffle_seed: int) -> list[str]:
    """The documents of sample `index` with num_docs documents, in context order."""
    own = list(corpus.questions[index].doc_ids)
    total = len(corpus.documents)
    if num_docs >= total:
        chosen = list(range(total))
    else:
        exclude = set(own)
        rng = random.Random(f"{seed}/{num_docs}/{index}")
        need = num_docs - len(own)
        # Draw from range() (no list of the whole corpus per sample: the train split has
        # ~500K documents) and drop own paragraphs; the extra draws cover those drops.
        drawn = [d for d in rng.sample(range(total), min(total, need + len(exclude)))
                 if d not in exclude]
        chosen = own + drawn[:need]
    docs = [corpus.documents[i] for i in chosen]
    random.Random(shuffle_seed).shuffle(docs)
    return docs


def format_context(documents: list[str]) -> str:
    return "\n\n".join(f"Document {i}:\n{doc}" for i, doc in enumerate(documents, start=1))


def ruler_hqa_records(corpus: Corpus, num_docs: int, indices: list[int],
                      seed: int = DEFAULT_SEED, shuffle_seed: int = DEFAULT_SHUFFLE_SEED
                      ) -> Iterator[dict]:
    """RULER-HQA records {context, input, answers, num_docs, index}, one per question."""
    check_num_docs(corpus, num_docs, indices)
    for index in indices:
        q = corpus.questions[index]
        context = format_context(sample_documents(corpus, index, num_docs, seed, shuffle_seed))
        yield {"context": context, "input": q.question, "answers": list(q.answers),
               "num_docs": num_docs, "index": index}


def training_rows(corpus: Corpus, num_docs: int, indices: list[int], seed: int = DEFAULT_SEED,
                  shuffle_seed: int = DEFAULT_SHUFFLE_SEED,
                  data_source: str = "hotpotqa") -> Iterator[dict]:
    """Rows in the parquet layout of the published `BytedTsinghua-SIA/hotpotqa`:
    {data_source, prompt: [{role: user, content: question}], context,
     reward_model: {ground_truth: [answer]}, extra_info: {index, question, num_docs}}."""
    for record in ruler_hqa_records(corpus, num_docs, indices, seed, shuffle_seed):
        question = record["input"]
        yield {"data_source": data_source,
               "prompt": [{"role": "user", "content": question}],
               "context": record["context"],
               "reward_model": {"ground_truth": record["answers"]},
               "extra_info": {"index": record["index"], "question": question,
                              "num_docs": num_docs}}


def length_label(num_docs: int) -> str:
    """The paper's column name for N documents ("7K" for 50), else "N docs"."""
    return LENGTH_LABELS.get(num_docs, f"{num_docs} docs")
