"""Training examples from a `datasets` source, served by a sharded `grain` iterator.

The source layout is verl's, as the published MemAgent training set
`BytedTsinghua-SIA/hotpotqa` has it (docs/algorithm.md section 4), one row per question:
    data_source: str                      selects the reward function
    prompt: [{"role": ..., "content": ...}, ...]    chat messages; the last is the question
    reward_model: {"ground_truth": str | [str, ...], ...}
    extra_info: {...}                     (optional) passed to the reward function
and the fields an agent reads beyond those (`required_fields`; MemAgent's `context`, the long
document): an existing verl data set loads unchanged. Every field of the row reaches the agent
(`Example.fields`). A source is a local parquet / json / jsonl file or a directory of them, an
`hf://` path, or a
hub id (read through `datasets`; from its cache with HF_HUB_OFFLINE=1, and refused at once
where the hub is out of reach: `data.io.load_from_hub`). The evaluation
layout that `memagent-jax data ruler-hqa` writes (context, input, answers) is read as well, so
validation can run on a RULER-HQA set.

`training_iterator` serves the rows in a seeded random order (a new permutation every epoch), or
in file order, forever. Every process of a multi-host job reads the same global stream: each
needs every example of a step, since the engine and learner are one SPMD program over all
hosts' devices. The position is a small JSON-able state (`get_state`/`set_state`), the same on
every process, which the checkpoint carries, so a resumed run, on any number of processes,
draws exactly the examples the uninterrupted run would have drawn.

`datasets` and `grain` are imported lazily: inference images often lack them.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence
from typing import Any

from memagent_jax.data.io import load_from_hub, looks_like_hub_id, quiet, unreadable_json
from memagent_jax.errors import UserError
from memagent_jax.extras import needs

REQUIRED_FIELDS = ("data_source", "prompt", "reward_model")
EVAL_FIELDS = ("input", "answers")  # evaluation sets (RULER-HQA's, `data synthetic`'s, ...)
_FILE_KINDS = {".parquet": "parquet", ".json": "json", ".jsonl": "json"}


@dataclasses.dataclass(frozen=True)
class Example:
    """One training row. index: the row in its source (a stable id, logged per step);
    question: the last prompt message's content; context: the row's `context` ("" where it
    has none); ground_truths: `reward_model.ground_truth` as strings; prompt: the chat
    messages; fields: every field of the row as read."""
    index: int
    data_source: str
    question: str
    context: str
    ground_truths: tuple[str, ...]
    extra_info: dict = dataclasses.field(default_factory=dict, compare=False)
    prompt: tuple[dict, ...] = dataclasses.field(default=(), compare=False)
    fields: dict = dataclasses.field(default_factory=dict, compare=False)


def load_source(spec: str, split: str = "train", key: str = "data",
                required: tuple[str, ...] = ("context",)):
    """The `datasets.Dataset` a source names (see the module docstring); `key` names the config
    key in errors; `required`: the fields the agent reads beyond verl's. Raises UserError when
    it is missing, empty, or lacks a required field (a missing file before a missing
    `datasets` package)."""
    extension = os.path.splitext(spec)[1].lower()
    kind = _FILE_KINDS.get(extension)
    local = os.path.exists(spec)
    formats = ("parquet, json or jsonl files (a file, a directory of them, or a hub id such as "
               "BytedTsinghua-SIA/hotpotqa)")
    if kind is None and not local and not looks_like_hub_id(spec):
        raise UserError(f"{key}: '{spec}' not found (expected {formats})")
    if kind is not None and not local and not spec.startswith("hf://"):
        raise UserError(f"{key}: '{spec}' not found")
    if os.path.isfile(spec) and kind is None:  # `datasets` would look for it on the hub
        what = f"a {extension} file" if extension else "a file without an extension"
        raise UserError(f"{key}: '{spec}' is {what}; training data is read from {formats}")
    if os.path.isdir(spec) and not any(os.path.splitext(name)[1].lower() in _FILE_KINDS
                                       for _, _, names in os.walk(spec) for name in names):
        raise UserError(f"{key}: '{spec}' is a directory without any .parquet, .json or "
                        ".jsonl file")
    with needs("train", "reading training data"):
        import datasets
    datasets.disable_progress_bars()  # the trainer has its own progress bar
    try:
        if kind is not None:
            load = functools.partial(datasets.load_dataset, kind, data_files=spec, split="train")
        else:
            load = functools.partial(datasets.load_dataset, spec, split=split)
        with quiet(datasets):
            dataset = load() if local else load_from_hub(load, f"{key}: '{spec}'")
    except UserError:
        raise
    except Exception as e:  # datasets raises many kinds; the user needs one line
        files = ([spec] if os.path.isfile(spec) else
                 sorted(os.path.join(d, n) for d, _, names in os.walk(spec) for n in names))
        problem = unreadable_json(files)
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{key}: {problem}" if problem else
                        f"{key}: cannot read '{spec}' (split '{split}'): {message}") from None
    if isinstance(dataset, datasets.DatasetDict):  # a directory whose files name splits
        if split not in dataset:
            raise UserError(f"{key}: '{spec}' has no split '{split}' "
                            f"(it has: {', '.join(dataset)})")
        dataset = dataset[split]
    layout = (EVAL_FIELDS if all(f in dataset.column_names for f in EVAL_FIELDS)
              else REQUIRED_FIELDS)
    missing = [f for f in (*layout, *required) if f not in dataset.column_names]
    if missing:
        raise UserError(f"{key}: '{spec}' lacks the field(s) {', '.join(missing)} "
                        f"(it has: {', '.join(dataset.column_names)})")
    if len(dataset) == 0:
        raise UserError(f"{key}: '{spec}' has no rows")
    example_from_row(dataset[0], 0, f"{key}: '{spec}'")  # a malformed layout fails here, early
    return dataset


def example_from_row(row: dict, index: int, source: str = "data") -> Example:
    """One row of the layout as an Example; errors name the row and the field."""
    where = f"{source} row {index}"
    row = {k: _listed(v) for k, v in row.items()}
    if "prompt" not in row and "input" in row:  # the evaluation layout
        row = {**row, "data_source": row.get("data_source") or "", "prompt": row["input"],
               "reward_model": {"ground_truth": row["answers"]},
               "extra_info": row.get("extra_info") or {k: row[k] for k in ("index", "num_docs")
                                                       if k in row}}
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not (isinstance(prompt, Sequence) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in prompt)):
        raise UserError(f"{where}: field 'prompt' must be chat messages [{{role: user, content: "
                        f"question}}, ...], got {row.get('prompt')!r:.80}")
    context = row.get("context", "")
    if not isinstance(context, str):
        raise UserError(f"{where}: field 'context' must be a string, got {type(context).__name__}")
    reward = row.get("reward_model")
    truths = reward.get("ground_truth") if isinstance(reward, dict) else None
    if isinstance(truths, (str, int, float)) and not isinstance(truths, bool):
        truths = [truths]
    if (not isinstance(truths, Sequence) or not truths or not all(
            isinstance(t, (str, int, float)) and not isinstance(t, bool) for t in truths)):
        raise UserError(f"{where}: field 'reward_model.ground_truth' must be a non-empty "
                        f"list of strings (or one string), got {truths!r:.80}")
    extra = row.get("extra_info")
    return Example(index=index, data_source=str(row.get("data_source") or ""),
                   question=prompt[-1]["content"], context=context,
                   ground_truths=tuple(str(t) for t in truths),
                   extra_info=dict(extra) if isinstance(extra, dict) else {},
                   prompt=tuple(dict(m) for m in prompt), fields=row)


class ExampleSource:
    """Random access to a dataset's rows as Examples (what `grain.MapDataset.source` reads)."""

    def __init__(self, dataset, name: str = "data"):
        self.dataset, self.name = dataset, name

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Example:
        return example_from_row(self.dataset[int(index)], int(index), self.name)


def concatenate(sources: list):
    """The rows of several loaded sources, in order, as one dataset."""
    if len(sources) == 1:
        return sources[0]
    with needs("train", "reading training data"):
        import datasets
    return datasets.concatenate_datasets(sources)


def training_iterator(dataset, seed: int, prefetch: int = 4, shuffle: bool = True):
    """An endless grain iterator of Examples (module docstring), in a seeded random order
    reshuffled every epoch, or in file order (shuffle False). It has get_state() -> dict and
    set_state(dict)."""
    with needs("train", "the training data pipeline"):
        import grain

    source = dataset if isinstance(dataset, ExampleSource) else ExampleSource(dataset)
    ds = grain.MapDataset.source(source)
    if shuffle:  # before repeat: grain re-seeds the permutation each epoch
        ds = ds.shuffle(seed=seed)
    ds = ds.repeat(None)
    # One reader thread keeps the order independent of timing; a few rows of read-ahead is
    # plenty, since a rollout takes far longer than reading a row.
    options = grain.ReadOptions(num_threads=1, prefetch_buffer_size=prefetch)
    return iter(ds.to_iter_dataset(options))


def take(iterator, count: int) -> list[Example]:
    """The next `count` examples."""
    return [next(iterator) for _ in range(count)]


def evaluation_examples(dataset, size: int | None = None, name: str = "data.val") -> list[Any]:
    """The first `size` rows (all when None), in order: a fixed validation set."""
    source = ExampleSource(dataset, name)
    return [source[i] for i in range(len(source) if size is None else min(size, len(source)))]


def _listed(value):
    """NumPy arrays (pandas-written parquet read back by pandas) -> lists, recursively."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: _listed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_listed(v) for v in value]
    return value
