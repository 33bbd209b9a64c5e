"""The `memagent-jax` command as a whole: --version."""

import os
import tomllib
from importlib import metadata

import pytest

import memagent_jax
from memagent_jax.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_version_is_the_installed_distributions(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out == f"memagent-jax {metadata.version('memagent-jax')}\n"


def test_the_packages_own_version_is_pyprojects():
    """(what --version says where the source tree runs without being installed)"""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        assert memagent_jax.__version__ == tomllib.load(f)["project"]["version"]
