"""A question and its document as MemAgent reads them: the question's ids and the document cut
into chunks of token ids (`read_sample`), centre-truncated first when `max_chunks` is set, each
chunk with its span of the document's text (what a server is sent)."""

from __future__ import annotations

import dataclasses

from memagent_jax.agents.memagent.config import MemAgentConfig
from memagent_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class Sample:
    """A question and its document as the workflow reads it, in the policy's tokens: the
    question's ids, the chunks' ids, and the document's length (before any max_chunks cut).
    initial_memory: the memory's ids before the first chunk (None: the template's "No
    previous memory"; given: a read that starts inside a document, from the memory held
    there). chunk_texts: each chunk's span of the document's text, what a server is sent
    (None: the chunks' ids decoded). Not the ids decoded where there is a text: a tokenizer's
    decoding need not read back as the same ids (memagent-tiny's role words decode without
    their space, "mona user" as "monauser"), and a server re-reads the text it is sent."""
    problem: str
    problem_ids: tuple[int, ...]
    chunks: tuple[tuple[int, ...], ...]
    document_tokens: int
    initial_memory: tuple[int, ...] | None = None
    chunk_texts: tuple[str, ...] | None = None


def centre_truncate(ids: list[int], max_tokens: int) -> list[int]:
    """ids, or its first and last max_tokens // 2 when longer than max_tokens (verl's
    `postprocess_data(..., truncation='center')`)."""
    if len(ids) <= max_tokens:
        return ids
    half = max_tokens // 2
    return ids[:half] + ids[len(ids) - half:]


def chunk_ids(ids: list[int], chunk_tokens: int, max_chunks: int | None = None) -> list[list[int]]:
    """chunk i = ids[i*C:(i+1)*C], after centre-truncating ids to max_chunks x C tokens."""
    if max_chunks:
        ids = centre_truncate(ids, max_chunks * chunk_tokens)
    return [ids[i:i + chunk_tokens] for i in range(0, len(ids), chunk_tokens)]


def read_sample(tokenizer, problem: str, document: str, config: MemAgentConfig,
                strict: bool = True) -> Sample:
    """The question and the document in the policy's tokens, the document cut into chunks.
    strict (a user's own question and document): raises UserError for an empty question or
    document, or a question over max_problem_tokens. Not strict (training and validation rows,
    as the original carries on): an empty document has no chunks (the agent answers from the
    initial memory) and an over-long question keeps its first max_problem_tokens tokens (the
    engine holds no more)."""
    problem_ids = tokenizer(problem, add_special_tokens=False)["input_ids"]
    if strict:
        check_read(problem, document, len(problem_ids), config.max_problem_tokens)
    problem_ids = problem_ids[:config.max_problem_tokens]
    offsets = getattr(tokenizer, "is_fast", False)  # a slow tokenizer has no offsets
    encoded = tokenizer(document, add_special_tokens=False, return_offsets_mapping=offsets)
    ids = encoded["input_ids"]
    chunks = chunk_ids(ids, config.chunk_tokens, config.max_chunks)
    texts = None
    if offsets:
        starts = [start for start, _ in encoded["offset_mapping"]] + [len(document)]
        texts = tuple(chunk_text(document, starts, c) for c in
                      chunk_ids(list(range(len(ids))), config.chunk_tokens, config.max_chunks))
    return Sample(problem, tuple(problem_ids), tuple(tuple(c) for c in chunks), len(ids),
                  chunk_texts=texts)


def check_read(problem: str, document: str, problem_tokens: int, budget: int,
               where: str = "") -> None:
    """What a strict read refuses: UserError (after `where`) for an empty question or document,
    or a question of more than `budget` tokens (`memagent.max_problem_tokens`)."""
    for text, what in ((problem, "question"), (document, "document")):
        if not text.strip():
            raise UserError(f"{where}the {what} is empty")
    if problem_tokens > budget:
        raise UserError(f"{where}the question has {problem_tokens} tokens, over the prompt "
                        f"budget of {budget} (memagent.max_problem_tokens)")


def chunk_text(document: str, starts: list[int], positions: list[int]) -> str:
    """The document's text of the tokens at `positions` (ascending; a centre-truncated chunk
    has a gap): each run of consecutive tokens from its first token's start to the next
    token's (starts[k]: where token k starts; starts[-1]: the document's end): consecutive
    chunks' texts join into the document's, and a character read as two tokens is not split
    (both tokens start where it does)."""
    runs, first = [], positions[0]
    for previous, position in zip(positions, positions[1:] + [-1]):  # -1: past the last
        if position != previous + 1:
            runs.append(document[starts[first]:starts[previous + 1]])
            first = position
    return "".join(runs)
