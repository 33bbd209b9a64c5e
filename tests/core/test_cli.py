"""The `memagent-jax` command as a whole: --version, and Ctrl-C where no command catches it."""

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


def test_ctrl_c_where_no_command_catches_it_is_one_line_and_exit_130(monkeypatch, capsys):
    """(a model still loading, say: train says what it kept once it runs, errors.Interrupted)"""
    from memagent_jax.models import command as models_command

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(models_command, "_random_model", interrupted)
    assert main(["random-model", "--preset", "tiny", "--out", "unused"]) == 130
    assert capsys.readouterr().err == "memagent-jax: interrupted (Ctrl-C)\n"
