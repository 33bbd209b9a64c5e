"""The documents' promises, held: every link in README.md, BENCHMARKS.md and docs/ resolves (a
file, and a heading of it where the link names an anchor); every shell command in them either
runs in a test (`RUN_BY`: the test files that run it) or says in the document why it does not
(`*Not run by the tests: WHY.*` before its block, `# not run: WHY` on its line or alone on
the line before); every
`memagent-jax` command in them parses with the real command line and names files that exist;
README's map names paths that exist; `.ci/run` runs README's test command; the reference pages
name every command and config key there is."""

import argparse
import dataclasses
import glob
import os
import re
import shlex

import pytest

from memagent_jax.cli import build_parser
from memagent_jax.eval.config import EvalConfig
from memagent_jax.rl.config import TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# docs/log/ is the dated history: written once, its commands those of its day.
DOCUMENTS = sorted(["README.md", "BENCHMARKS.md"] + [
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                recursive=True)
    if not p.startswith(os.path.join(ROOT, "docs", "log"))])
LINKED = DOCUMENTS + sorted(  # documents whose links are checked, not their commands
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "configs", "**", "README.md"),
                                                recursive=True))

# A command's leading words -> the files that run it (a `memagent-jax` subcommand: the test
# files that call it through `cli.main`, on tiny models where the document names a large one).
RUN_BY = {
    "memagent-jax convert": ["tests/models/test_conversion.py"],
    "memagent-jax export": ["tests/models/test_conversion.py", "tests/rl/test_trainer.py"],
    "memagent-jax random-model": ["tests/models/test_conversion.py"],
    "memagent-jax vocab": ["tests/e2e/test_memagent_tiny.py"],
    "memagent-jax generate": ["tests/engine/test_generate_cli.py"],
    "memagent-jax run": ["tests/rollout/test_run_cli.py", "tests/e2e/test_against_serve.py"],
    "memagent-jax demo": ["tests/synthetic/test_demo.py"],
    "memagent-jax trace": ["tests/synthetic/test_demo.py"],
    "memagent-jax serve": ["tests/serve/test_serve.py"],
    "memagent-jax train": ["tests/rl/test_trainer.py", "tests/e2e/test_agent_training.py"],
    "memagent-jax curves": ["tests/rl/test_curves.py"],
    "memagent-jax eval": ["tests/eval/test_eval.py"],
    "memagent-jax eval-compare": ["tests/eval/test_compare.py"],
    "memagent-jax data ruler-hqa": ["tests/data/test_data.py"],
    "memagent-jax data hotpotqa-train": ["tests/data/test_data.py"],
    "memagent-jax data ruler": ["tests/data/test_data.py"],
    "memagent-jax data needle": ["tests/data/test_data.py"],
    "memagent-jax data synthetic": ["tests/synthetic/test_tasks.py"],
    "memagent-jax data lookup": ["tests/e2e/test_agents_against_serve.py"],
    # the install and the checks: CI's own command (.ci/run, a fresh virtualenv)
    "python3 -m venv": [".ci/run"],
    ". .venv/bin/activate": [".ci/run"],
    "pip install": [".ci/run"],
    "ruff check": [".ci/run"],
    "mypy": [".ci/run"],
    "python -m pytest": [".ci/run"],
}
SHELL = {"printf", "cd", "export", "for", "done"}  # setting a command up, not one
MARKER = re.compile(r"^\*Not run by the tests: .{8,}\*$")
LINE_MARKER = re.compile(r"#.*\bnot run: .{8,}", re.I)
HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _read(name) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def _outside_code(text) -> list[str]:
    """The text's lines outside fenced blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, code marks and punctuation dropped,
    spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(name) -> set[str]:
    found, seen = set(), {}
    for line in _outside_code(_read(name)):
        if m := HEADING.match(line):
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(name) -> list[str]:
    return [m.group(1) for line in _outside_code(_read(name)) for m in LINK.finditer(line)]


@pytest.mark.parametrize("name", LINKED)
def test_every_link_resolves_to_a_file_and_its_anchor(name):
    wrong = []
    for target in links(name):
        if re.match(r"[a-z]+:", target):  # https:, mailto: (no network here)
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(ROOT, os.path.dirname(name), path)) if path else \
            os.path.join(ROOT, name)
        if not os.path.exists(full):
            wrong.append(f"{target}: no such file")
        elif anchor and (not full.endswith(".md")
                         or anchor not in anchors(os.path.relpath(full, ROOT))):
            wrong.append(f"{target}: no heading #{anchor}")
    assert not wrong, f"{name}: {wrong}"


def test_the_link_check_catches_a_wrong_anchor_and_a_missing_file():
    assert "the-suites-time" in anchors("docs/contributing.md")
    assert slug("Decode (`benchmarks/decode.py`)") == "decode-benchmarksdecodepy"
    assert slug("The synthetic recipe's step times, and the CLI") == \
        "the-synthetic-recipes-step-times-and-the-cli"
    assert LINK.findall("see [a](b.md#c) and ![img](x.png)") == ["b.md#c"]


@dataclasses.dataclass
class Command:
    document: str
    words: list[str]
    marked: bool  # the document says why the tests do not run it

    def __str__(self):
        return f"{self.document}: {shlex.join(self.words)}"


def _words(text) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars="|&;>")
    lexer.whitespace_split = True
    return list(lexer)


def commands(name) -> list[Command]:
    """The shell commands of a document's `bash` blocks (lines continued with `\\` or inside
    quotes are one; `&&`, `|` and `;` separate commands; comments and redirections dropped)."""
    found, block, before = [], None, ""
    for line in _read(name).splitlines():
        if block is None:
            if line.startswith("```bash"):
                block, marked, pending, above = [], bool(MARKER.match(before)), "", False
            elif line.strip():
                before = line.strip()
            continue
        if line.startswith("```"):
            block = None
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line + "\n"
        try:
            tokens = _words(pending)
        except ValueError:  # a quote still open
            continue
        if not tokens:
            above = above or bool(LINE_MARKER.match(line.strip()))
            pending = ""
            continue
        line_marked = marked or above or bool(LINE_MARKER.search(pending))
        pending, words, above = "", [], False
        for token in tokens + [";"]:
            if token not in ("&&", "|", ";", "||"):
                words.append(token)
                continue
            while words and (re.match(r"^[A-Z_]+=", words[0])  # PYTHONPATH=. memagent-jax
                             or words[0] == "do"):  # a loop's body
                words = words[1:]
            if ">" in words:
                words = words[:words.index(">")]
            if words and words[0] not in SHELL:
                found.append(Command(name, words, line_marked))
            words = []
    return found


def _run_by(words) -> str | None:
    for length in (3, 2, 1):
        if (key := " ".join(words[:length])) in RUN_BY:
            return key
    return None


def _runs_it(path, key) -> bool:
    """Whether the file at `path` runs the command `key`: CI's script holds its words; a test
    file gives `cli.main` (or the module) an argument list that starts with the subcommand's
    words."""
    text = _read(path)
    if path == ".ci/run":
        return key.split()[0] in text
    sub = key.split()[1:]
    call = r'",\s*"'.join(re.escape(w) for w in sub)
    return re.search(rf'(\[|memagent_jax\.cli",)\s*"{call}"', text) is not None


ALL_COMMANDS = [c for name in DOCUMENTS for c in commands(name)]


def test_every_command_runs_in_a_test_or_says_why_not():
    unaccounted = [str(c) for c in ALL_COMMANDS
                   if not c.marked and _run_by(c.words) is None]
    assert not unaccounted, unaccounted
    assert len(ALL_COMMANDS) > 50  # the blocks were read


@pytest.mark.parametrize("key", sorted(RUN_BY))
def test_the_files_said_to_run_a_command_run_it(key):
    for path in RUN_BY[key]:
        assert _runs_it(path, key), f"{path} does not run `{key}`"


def _parser_exits(parser, argv) -> str | None:
    try:
        parser.parse_args(argv)
    except SystemExit as e:
        return f"exit {e.code}"
    return None


def test_every_memagent_jax_command_parses_and_names_files_that_exist(capsys):
    parser = build_parser()
    wrong = []
    for c in ALL_COMMANDS:
        if c.words[0] != "memagent-jax" or "--help" in c.words:
            continue
        if error := _parser_exits(parser, c.words[1:]):
            wrong.append(f"{c}: {error} {capsys.readouterr().err.strip().splitlines()[-1:]}")
        inputs = [c.words[i + 1] for i, w in enumerate(c.words[:-1]) if w == "--config"]
        inputs += [w.split("=", 1)[-1] for w in c.words if w.startswith("model.path=")]
        for path in inputs:  # those in this repository, a loop's variables aside
            if re.match(r"(configs|checkpoints)/[^$<]*$", path) and \
                    not os.path.exists(os.path.join(ROOT, path)):
                wrong.append(f"{c}: no {path}")
    assert not wrong, wrong


def test_the_command_check_catches_a_flag_that_does_not_exist(capsys):
    assert _parser_exits(build_parser(), ["demo", "--lenght", "8K"]) is not None
    assert _parser_exits(build_parser(), ["demo", "--length", "8K"]) is None


def test_every_benchmark_command_names_a_script_that_exists():
    text = _read("BENCHMARKS.md")
    scripts = set(re.findall(r"benchmarks/[\w/]+\.(?:py|sh)", text))
    assert len(scripts) > 10
    assert [s for s in scripts if not os.path.exists(os.path.join(ROOT, s))] == []


def _readme_block(after: str) -> str:
    text = _read("README.md")
    return re.search(rf"{after}.*?```\w*\n(.*?)```", text, re.S).group(1)


def test_ci_runs_the_readmes_test_command_verbatim():
    command = _readme_block("Install and run the tests").strip()
    ci = _read(".ci/run").strip().splitlines()[-1]
    assert ci == command, (ci, command)


def test_the_readmes_map_names_paths_that_exist():
    block = _readme_block("## Where things are")
    paths = [p.rstrip(",") for line in block.splitlines()
             for p in line.split("  ")[0].split()]
    assert len(paths) > 25
    assert [p for p in paths if not os.path.exists(os.path.join(ROOT, p))] == []


def test_the_readme_stays_a_front_door():
    """About 200 lines, no paragraph over ~100 words, one results table."""
    text = _read("README.md")
    assert len(text.splitlines()) <= 210
    paragraphs = re.split(r"\n\s*\n", "\n".join(_outside_code(text)))
    long = [p[:60] for p in paragraphs if not p.startswith("|") and len(p.split()) > 110]
    assert not long, long
    tables = [p for p in paragraphs if p.startswith("|")]
    assert len(tables) == 1, len(tables)


def test_the_cli_reference_names_every_command():
    text = _read("docs/reference/cli.md")
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    names = [n for n in sub.choices if n != "data"]
    (data,) = [a for a in sub.choices["data"]._actions
               if isinstance(a, argparse._SubParsersAction)]
    names += [f"data {n}" for n in data.choices]
    assert [n for n in names if f"| `{n}` |" not in text] == []


@pytest.mark.parametrize("schema", [TrainConfig, EvalConfig])
def test_the_config_reference_names_every_top_level_key(schema):
    text = _read("docs/reference/config.md")
    assert [f.name for f in dataclasses.fields(schema)
            if f"| `{f.name}` |" not in text] == []
