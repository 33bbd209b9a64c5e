"""`memagent-jax demo`: a memory agent trained on the synthetic tasks reads a document nobody
has seen, and answers.

A fresh synthetic document (`tasks`: made-up text with a few facts of the same form
at random depths; seed drawn at random unless given, printed with the command line that
repeats the run) of the requested length in the model's tokens; the agent reads it chunk by
chunk, greedily, under a progress bar; then the memory's history (the turns where it changed,
abbreviated), where the facts were, and the answer next to the truth. A length whose reading
the available memory cannot hold is refused before the model loads (READ_BYTES_PER_TOKEN).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shlex
import time
from collections.abc import Callable
from typing import Any

from memagent_jax.errors import UserError

# Bytes of memory a token of the document takes at the demo's peak, while the tokenizer splits
# it (measured: 645-697 from 1M to 8M tokens, nearly all of it the tokenizer's; the document
# itself is 4, the ids kept about 50).
READ_BYTES_PER_TOKEN = 700


def load_agent(model: str, task: str, length: int, budgets: dict, slots: int = 1):
    """The agent `model` (a directory or a shipped model's name) runs on synthetic documents of
    `task` and `length` tokens: (the loaded model, the rollouts it runs through (an engine of
    `slots` slots sized for its budgets, the model's parameters), the agent, its
    MemAgentConfig).
    budgets: MemAgentConfig fields given on the command line (None: the model's own).
    UserError for an unknown task or model, a tokenizer that cannot represent the documents'
    words, or a length below one chunk."""
    from memagent_jax import model_dir
    from memagent_jax.agents.memagent.agent import MemAgent
    from memagent_jax.agents.memagent.config import MemAgentConfig
    from memagent_jax.commandline import from_flags
    from memagent_jax.engine.engine_api import EngineConfig
    from memagent_jax.engine.factory import load_model_section
    from memagent_jax.engine.model_section import ModelSection
    from memagent_jax.rollout.runner import build_runner
    from memagent_jax.synthetic import tasks as synthetic
    from memagent_jax.tokenizer import check_representable

    synthetic.check_task(task)
    if not os.path.isdir(model_dir.resolve(os.path.expanduser(model))):
        raise UserError(f"--model {model}: neither a model directory nor a shipped model "
                        f"(shipped: {', '.join(model_dir.shipped_names()) or 'none yet'})")
    section = ModelSection(path=model)
    tokenizer = section.load_tokenizer(required=True)
    check_representable(tokenizer, " ".join(synthetic.words().all()),
                        f"--model {model} (the synthetic documents' words)")
    config = from_flags(MemAgentConfig.from_model, model_path=section.path, **budgets)
    if length < max(config.chunk_tokens, synthetic.min_length(task)):
        if budgets.get("chunk_tokens") is not None and length >= synthetic.min_length(task):
            raise UserError(f"--chunk-tokens {config.chunk_tokens}: more than the document's "
                            f"--length {length}; give a --chunk-tokens of at most {length} "
                            "(or a longer --length)")
        raise UserError(f"--length {length}: below one chunk of {config.chunk_tokens} tokens "
                        f"(a {task} document needs at least "
                        f"{max(config.chunk_tokens, synthetic.min_length(task))})")
    loaded = load_model_section(section, tokenizer)
    agent = MemAgent(config)
    runner = from_flags(build_runner, agent=agent, model=loaded.model, tokenizer=tokenizer,
                        engine=from_flags(EngineConfig, slots=slots), mesh=None,
                        stop_ids=loaded.stop_ids)
    return loaded, runner.with_params(loaded.params), agent, config


@dataclasses.dataclass(frozen=True)
class DemoRead:
    """What the demo read and the agent wrote: the document (a tasks.Sample), its chunks as
    decoded text, the memory after each chunk, the answer, the chunk size in tokens."""
    document: Any
    chunk_texts: list[str]
    memories: list[str]
    answer: str
    chunk_tokens: int


def run_demo(model: str, task: str, length: int, seed: int | None, show: int,
             budgets: dict, poll: Callable[[], None] = lambda: None) -> DemoRead:
    """Runs the demo; prints to stdout (progress on stderr); returns what it read.
    budgets: as `load_agent` takes them. poll: called while the document is built, once it is
    tokenized and after every turn (the command's check for Ctrl-C, which raises)."""
    from memagent_jax.agents.memagent.agent import memories_of
    from memagent_jax.console import progress_bar
    from memagent_jax.engine.sampling import SamplingParams
    from memagent_jax.synthetic import tasks as synthetic

    synthetic.check_memory(f"--length {length}: a document of {length:,} tokens takes about "
                           f"{READ_BYTES_PER_TOKEN} bytes a token to read (the tokenizer's, "
                           "mostly)", READ_BYTES_PER_TOKEN * length)
    _, rollouts, agent, config = load_agent(model, task, length, budgets)
    seed = secrets.randbelow(10 ** 6) if seed is None else seed
    poll()
    document = synthetic.make_sample(task, length, seed, 0, poll)
    print(f"{task} document of {length:,} tokens (seed {seed}), read {config.chunk_tokens} "
          f"tokens a turn by {model}")
    print(f"the same run again: {repeat_command(model, task, length, seed, show, budgets)}")
    print(f"question: {document.question}")
    sample = agent.read(document.question, document.context)
    poll()  # before the first turn, which compiles the model (seconds)
    start = time.perf_counter()
    with progress_bar(total=len(sample.chunks) + 1, desc="reading", unit="turn") as bar:
        def on_call(_row):
            bar.update(1)
            poll()

        (trajectory,), = rollouts.run(agent, [sample], SamplingParams(0.0), on_call=on_call)
    seconds = time.perf_counter() - start

    words = document.context.split()  # the synthetic tokenizer's tokens: one a word
    for fact in document.facts:
        chunk = synthetic.find(words, fact.text.split()) // config.chunk_tokens + 1
        print(f"  fact in chunk {chunk:>5}: {fact.text}" + ("   <- needed" if fact.needed else ""))
    print("memory, at the turns where it changed:")
    memories = memories_of(trajectory)
    changes = [(i, m) for i, m in enumerate(memories) if i == 0 or m != memories[i - 1]]
    for i, memory in changes[:show]:
        print(f"  after chunk {i + 1:>5}: {abbreviate(memory)}")
    if len(changes) > show:
        print(f"  ... {len(changes) - show} more changes; after the last chunk: "
              f"{abbreviate(memories[-1])}")
    answer = (trajectory.answer or "").strip()  # the boxed text as the model spaced it
    correct = answer == document.answer
    print(f"answer: {answer}   truth: {document.answer}   "
          f"({'correct' if correct else 'wrong'}; {len(trajectory.turns)} turns in "
          f"{seconds:.0f} s, {length / seconds:,.0f} tokens/s)")
    return DemoRead(document, [agent.tokenizer.decode(c) for c in sample.chunks], memories,
                    answer, config.chunk_tokens)


def repeat_command(model: str, task: str, length: int, seed: int, show: int,
                   budgets: dict) -> str:
    """The command line that reads the same document the same way (the demo is greedy)."""
    argv = ["memagent-jax", "demo", "--model", model, "--task", task, "--length", str(length),
            "--seed", str(seed), "--show", str(show)]
    for name, value in budgets.items():
        if value is not None:
            argv += ["--" + name.replace("_", "-"), str(value)]
    return shlex.join(argv)


def abbreviate(text: str, limit: int = 100) -> str:
    text = " / ".join(line.strip() for line in text.splitlines() if line.strip()) or "(empty)"
    return text if len(text) <= limit else text[:limit - 3] + "..."
