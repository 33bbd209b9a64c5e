"""mypy's settings (pyproject.toml) hold types as a contract: a module that misuses an optional
value, or passes or assigns one where a plain type is declared, fails them. (Whether the package
passes them is CI's `mypy` step, run before the tests.)"""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Each misuse on a line of its own, with the error code mypy must give it.
PLANTED = '''\
def plus_one(x: int | None) -> int:
    return x + 1  # operator


def length(text: str) -> int:
    return len(text)


def length_or_none(text: str | None) -> int:
    return length(text)  # arg-type


def fallback() -> int:
    count: int = None  # assignment
    return count
'''


@pytest.mark.slow
def test_an_optional_value_used_as_a_plain_one_fails_the_projects_mypy_settings(tmp_path):
    module = tmp_path / "planted.py"
    module.write_text(PLANTED)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", os.path.join(ROOT, "pyproject.toml"),
         "--cache-dir", str(tmp_path / "cache"), str(module)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    expected = {(n, code) for n, line in enumerate(PLANTED.splitlines(), 1)
                for code in re.findall(r"# ([a-z-]+)$", line)}
    found = set((int(n), code) for n, code in
                re.findall(r"^planted\.py:(\d+): error: .*\[([a-z-]+)\]$", result.stdout, re.M))
    assert result.returncode == 1, result.stdout + result.stderr
    assert found == expected, result.stdout
