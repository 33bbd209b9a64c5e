"""The `memagent-jax` command as a whole: --version, Ctrl-C where no command catches it, and
JAX's platform on a machine without an accelerator."""

import json
import os
import subprocess
import sys
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


@pytest.mark.slow
@pytest.mark.parametrize("first", ["memagent_jax", "jax"])
def test_a_program_using_the_package_starts_jax_without_tpu_runtime_noise(first):
    """The Python API, as the CLI: importing memagent_jax selects the CPU where no accelerator
    is attached, also after JAX itself was imported (the TPU runtime's five lines came)."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    program = (f"import {first}\nimport jax\nimport memagent_jax\n"
               "print(jax.numpy.ones(2).sum())")
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         env=env, timeout=120, cwd=ROOT)
    assert run.returncode == 0 and run.stdout == "2.0\n", run.stderr
    assert "TPU" not in run.stderr, run.stderr


@pytest.mark.slow
def test_a_machine_without_an_accelerator_runs_commands_without_tpu_runtime_noise(tmp_path):
    """The test install has libtpu, which JAX starts wherever it is installed, and which then
    prints its failure to find a TPU (once the tokenizer has loaded torch: `generate` does).
    Without JAX_PLATFORMS set, a command on this CPU-only machine prints only its own line."""
    prompts = tmp_path / "in.jsonl"
    prompts.write_text(json.dumps({"prompt": "the code of"}) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    run = subprocess.run([sys.executable, "-m", "memagent_jax.cli", "generate", "--model",
                          "memagent-tiny", "--input", str(prompts), "--out",
                          str(tmp_path / "out.jsonl"), "--max-new-tokens", "2"],
                         capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "TPU" not in run.stderr, run.stderr
