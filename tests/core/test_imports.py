"""The package's imports as a graph with one direction.

A node is a package of memagent_jax (`models`, `rl`, ...) or a top-level module (`tokenizer`,
`errors`, ...); the command line (`cli.py` and every package's `command.py`) is one node of
its own above everything, so a package's library never imports a command module. Every import
counts, at module level or inside a function. `ALLOWED` holds the edges the code may have;
docs/architecture.md quotes it (`render`), and a new edge is a change to this table.
"""

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "memagent_jax")

# node -> the nodes it may import. Bottom up: the foundation (standard library and one
# another), the tokenizer, then models <- engine <- rollout <- agents <- data <- eval <- rl,
# serve on the engine and rollout, the shipped agents (MemAgent the default, reached by name
# from rl and eval), the experiments (synthetic, lookup) above the core, and the command line
# on top.
ALLOWED = {
    "errors": set(),
    "hostmemory": set(),
    "distributed": {"errors"},
    "extras": {"errors"},
    "runconfig": {"errors"},
    "model_dir": {"errors"},
    "fileutil": {"distributed", "errors"},
    "console": {"distributed"},
    "commandline": {"distributed", "errors"},
    "memagent_jax": {"distributed", "extras"},
    "tokenizer": {"errors", "model_dir"},
    "models": {"distributed", "errors", "fileutil", "model_dir"},
    "engine": {"errors", "fileutil", "hostmemory", "model_dir", "models", "runconfig",
               "tokenizer"},
    "rollout": {"distributed", "engine", "errors", "models", "tokenizer"},
    "agents": {"engine", "errors", "model_dir", "models", "rollout", "runconfig", "serve",
               "tokenizer"},
    "data": {"agents", "errors", "extras", "fileutil", "tokenizer"},
    "eval": {"agents", "console", "data", "distributed", "engine", "errors", "extras",
             "fileutil", "models", "rollout", "runconfig"},
    "rl": {"agents", "console", "data", "distributed", "engine", "errors", "eval", "extras",
           "fileutil", "model_dir", "models", "rollout", "runconfig"},
    "serve": {"engine", "errors", "extras", "rollout", "tokenizer"},
    "lookup": {"agents", "data", "errors", "fileutil", "rollout", "runconfig"},
    "synthetic": {"agents", "commandline", "console", "data", "distributed", "engine", "errors",
                  "eval", "fileutil", "hostmemory", "model_dir", "rl", "rollout", "runconfig",
                  "tokenizer"},
    "cli": {"agents", "commandline", "console", "data", "distributed", "engine", "errors",
            "eval", "extras", "fileutil", "lookup", "memagent_jax", "model_dir", "models", "rl",
            "rollout", "runconfig", "serve", "synthetic", "tokenizer"},
}
CORE = ("models", "engine", "rollout", "agents", "data", "eval", "rl", "serve")
EXPERIMENTS = ("synthetic", "lookup")


def modules(package: str = PACKAGE) -> dict[str, str]:
    """Dotted module name -> file, for every module of the package."""
    found = {}
    for directory, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                dotted = os.path.relpath(path[:-3], os.path.dirname(package)).replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def imported(path: str, known: dict[str, str]) -> set[str]:
    """The package's modules a file imports (anywhere in it), each resolved to the longest
    known module name."""
    names = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                names.add(full if full in known else node.module)
    out = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            out.add(name)
    return out


def node_of(module: str) -> str:
    parts = module.split(".")
    if module == "memagent_jax.cli" or parts[-1] == "command":
        return "cli"
    return parts[1] if len(parts) > 1 else "memagent_jax"


def graphs(package: str = PACKAGE) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> modules it imports, node -> nodes it imports; self-imports left out)."""
    known = modules(package)
    by_module = {m: imported(path, known) - {m} for m, path in known.items()}
    by_node: dict[str, set[str]] = {}
    for module, targets in by_module.items():
        for target in targets:
            if node_of(module) != node_of(target):
                by_node.setdefault(node_of(module), set()).add(node_of(target))
    return by_module, by_node


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph`, or None."""
    state: dict[str, int] = {}

    def visit(u, path):
        state[u] = 1
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                return path[path.index(v):] + [v]
            if not state.get(v):
                found = visit(v, path + [v])
                if found:
                    return found
        state[u] = 2
        return None

    for start in sorted(graph):
        if not state.get(start):
            found = visit(start, [start])
            if found:
                return found
    return None


def render() -> str:
    """ALLOWED as docs/architecture.md quotes it: one line a node, bottom up."""
    order, placed = [], set()
    while len(order) < len(ALLOWED):
        ready = sorted(n for n in ALLOWED if n not in placed and ALLOWED[n] <= placed)
        order += ready
        placed |= set(ready)
    return "\n".join(f"- `{n}` -> {', '.join(f'`{t}`' for t in sorted(ALLOWED[n])) or '(nothing)'}"
                     for n in order)


def test_no_import_outside_the_allowed_edges():
    _, by_node = graphs()
    extra = {f"{a} -> {b}" for a, targets in by_node.items()
             for b in targets if b not in ALLOWED.get(a, set())}
    assert not extra, f"imports against the graph (tests/core/test_imports.py ALLOWED): {extra}"


def test_the_graph_has_one_direction_and_modules_no_circle():
    assert cycle(ALLOWED) is None
    by_module, _ = graphs()
    assert cycle(by_module) is None, f"an import circle: {' -> '.join(cycle(by_module))}"
    # the core knows no experiment
    assert all(e not in ALLOWED[n] for n in CORE for e in EXPERIMENTS)


def test_a_new_edge_or_circle_is_caught(tmp_path):
    """A copy of the package with one import added against the graph (models importing rl,
    which imports models: a circle too) fails both checks."""
    import shutil
    copy = tmp_path / "memagent_jax"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("pretrained", "__pycache__"))
    qwen = copy / "models" / "qwen.py"
    qwen.write_text(qwen.read_text() + "\nfrom memagent_jax.rl import learner  # noqa\n")
    by_module, by_node = graphs(str(copy))
    assert "rl" in by_node["models"] and "rl" not in ALLOWED["models"]
    assert cycle(by_module) is not None


def test_architecture_quotes_the_graph():
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        assert render() in f.read(), ("docs/architecture.md: paste "
                                      "tests/core/test_imports.py render()")


@pytest.mark.slow
def test_the_training_eval_and_serve_paths_load_no_experiment_module():
    code = ("import sys, memagent_jax.rl.trainer, memagent_jax.eval.runner, "
            "memagent_jax.serve.app; "
            "print([m for m in sys.modules if 'synthetic' in m or 'carr' in m "
            "or 'lookup' in m])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=240, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.slow
def test_a_config_loads_the_engines_contract_not_its_kernels():
    """Reading a train or eval config imports engine/engine_api.py, not the engine and the
    Pallas kernels it compiles. (flax itself loads jax._src.pallas through jax.extend: not
    counted; jax.experimental.pallas is what a kernel imports.)"""
    code = ("import sys, memagent_jax.rl.config, memagent_jax.eval.config; "
            "print(sorted(m for m in sys.modules if m.startswith('jax.experimental.pallas') "
            "or m in ('memagent_jax.engine.engine', 'memagent_jax.models.cache_kernels')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=240, check=True)
    assert out.stdout.strip() == "[]", out.stdout
