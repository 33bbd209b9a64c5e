"""The core knows no experiment: models, rollout, rl, eval, serve and data import nothing from
memagent_jax.synthetic (not even inside a function), and loading the training, evaluation and
serving paths loads none of it."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "memagent_jax")
CORE = ("models", "rollout", "rl", "eval", "serve", "data")


@pytest.mark.parametrize("package", CORE)
def test_no_core_module_imports_the_experiment(package):
    pattern = re.compile(r"^\s*(from|import)\s+memagent_jax(\.\w+)*\.synthetic\b|"
                         r"^\s*from\s+memagent_jax(\.\w+)*\s+import\s+.*\bsynthetic\b", re.M)
    found = []
    for directory, _, files in os.walk(os.path.join(PACKAGE, package)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as f:
                    if pattern.search(f.read()):
                        found.append(os.path.relpath(path, ROOT))
    assert not found, f"the core imports the experiment: {found}"


def test_the_training_eval_and_serve_paths_load_no_experiment_module():
    code = ("import sys, memagent_jax.rl.trainer, memagent_jax.eval.runner, "
            "memagent_jax.serve.app; "
            "print([m for m in sys.modules if 'synthetic' in m or 'carr' in m])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=240, check=True)
    assert out.stdout.strip() == "[]", out.stdout
