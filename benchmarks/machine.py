"""The CPU's model name, for the machine line each benchmark prints beside its figures."""

from __future__ import annotations

import platform
import subprocess


def cpu_model_name() -> str:
    """lscpu's "Model name", else platform.processor(), else "?"."""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.split("\n"):
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"
