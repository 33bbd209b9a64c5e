"""Optional dependencies (memagent_jax/extras.py): every import of one goes through
`extras.needs`, the extras it names are pyproject.toml's, a missing package is one line naming
it and its extra, and no command prints transformers' notice that PyTorch is missing."""

import os
import re
import subprocess
import sys
import tomllib

import pytest

from memagent_jax.cli import main
from memagent_jax.extras import EXTRAS, needs
from tests.builders import block_package

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPTIONAL = sorted({p for packages in EXTRAS.values() for p in packages})
# Packages no module of ours may import at all: the default install has neither.
NEVER = ("torch", "openai", "fastapi")
IMPORT = re.compile(r"^(\s*)(?:import|from)\s+(\w+)")
WITH_NEEDS = re.compile(r'^\s*with needs\("(\w+)"')


def _package_lines():
    for directory, _, files in os.walk(os.path.join(ROOT, "memagent_jax")):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, ROOT), f.read().splitlines()


def test_every_optional_import_is_in_a_needs_block_of_its_extra():
    bare, never = [], []
    for path, lines in _package_lines():
        for number, line in enumerate(lines):
            match = IMPORT.match(line)
            if not match:
                continue
            indent, package = len(match.group(1)), match.group(2)
            never += [f"{path}:{number + 1}"] * (package in NEVER)
            if package not in OPTIONAL:
                continue
            outer = next((text for text in reversed(lines[:number]) if text.strip()
                          and len(text) - len(text.lstrip()) < indent), "")
            extra = WITH_NEEDS.match(outer)
            if not extra or package not in EXTRAS[extra.group(1)]:
                bare.append(f"{path}:{number + 1}: {line.strip()}")
    assert not bare, "optional imports outside `with needs(<its extra>, ...)`:\n" + "\n".join(bare)
    assert not never, f"imports of {', '.join(NEVER)}: {never}"


def test_the_extras_are_pyprojects():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        declared = tomllib.load(f)["project"]["optional-dependencies"]
    for extra, packages in EXTRAS.items():
        names = {re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("-", "_")
                 for requirement in declared[extra]}
        assert set(packages) <= names, (extra, set(packages) - names)


def test_a_missing_module_of_no_extra_is_not_taken_for_one():
    """(a dependency of an installed package: a broken installation, whose traceback helps)"""
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency"), needs("data", "a plot"):
        import no_such_dependency  # noqa: F401


def _data_needle(tmp_path):
    return ["data", "needle", "--out", str(tmp_path / "needle")]


def _curves(tmp_path):
    from memagent_jax.rl.tensorboard import ScalarWriter
    writer = ScalarWriter(str(tmp_path / "run" / "logs" / "tensorboard"), process_index=0)
    writer.scalars(1, {"reward/mean": 0.5})
    writer.close()
    return ["curves", str(tmp_path / "run"), "--out", str(tmp_path / "c.png")]


def _eval(tmp_path):
    from memagent_jax.data.io import write_parquet
    path = str(tmp_path / "eval_12.parquet")
    write_parquet(path, [{"context": "a b c", "input": "q", "answers": ["a"], "index": 0}])
    return ["eval", "--config", os.path.join(ROOT, "configs", "eval", "tiny_cpu.yaml"),
            "model.path=memagent-tiny", f"data.sets=[{path}]", f"output_dir={tmp_path / 'o'}"]


@pytest.mark.parametrize("command, package, extra", [
    (_data_needle, "pyarrow", "data"),
    (_curves, "matplotlib", "train"),
    (_curves, "tensorboard", "train"),
    (_eval, "pyarrow", "data"),  # a .parquet set
], ids=lambda value: getattr(value, "__name__", value).strip("_"))
def test_a_missing_package_is_one_line_naming_its_extra(command, package, extra, tmp_path,
                                                        monkeypatch, capsys):
    argv = command(tmp_path)
    block_package(monkeypatch, package)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memagent-jax: error: "), err
    assert err[0].endswith(f"needs {package}, which is not installed: "
                           f"pip install 'memagent-jax[{extra}]'"), err
    assert not any((tmp_path / name).exists() for name in ("needle", "c.png", "o"))


@pytest.mark.slow
def test_no_command_prints_that_pytorch_is_missing(tmp_path):
    """transformers logs the notice at import when torch is not installed; `data needle`
    imports transformers to write its tokenizer."""
    code = ("import sys; sys.modules['torch'] = None; from memagent_jax.cli import main; "
            "sys.exit(main())")
    run = subprocess.run([sys.executable, "-c", code, "data", "needle", "--out",
                          str(tmp_path / "needle"), "--train-size", "2", "--val-size", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "needle" / "tokenizer" / "tokenizer.json").is_file()
    assert "PyTorch" not in run.stderr, run.stderr
