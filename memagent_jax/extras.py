"""Optional dependencies: pyproject.toml's extras, and what a missing one looks like.

Every import of an optional package (`EXTRAS`) sits in a `with needs(extra, purpose):` block,
so that a package that is not installed is one line naming it and the extra that installs it
(`MissingExtra`, a UserError: the CLI prints it and exits 2), not a traceback. The imports stay
where they were, inside the functions that use them: GPU images often lack these packages, and
the commands that do not need them must start without them.

`quiet_torch_notice` keeps transformers, which we use for tokenizers only, from announcing at
import that PyTorch is missing: no command needs torch.

Standard library only at import (the package's `__init__` imports this module).
"""

from __future__ import annotations

import contextlib
import logging

from memagent_jax.errors import UserError

# The optional packages memagent_jax imports, by the extra of pyproject.toml that installs them
# (import names; tests/core/test_extras.py checks them against pyproject.toml).
EXTRAS = {
    "data": ("datasets", "grain", "matplotlib", "pyarrow"),
    "train": ("datasets", "grain", "matplotlib", "pyarrow", "tensorboard"),
    "serve": ("starlette", "uvicorn"),
}

# What transformers logs at import when torch is missing (transformers/__init__.py).
_TORCH_NOTICE = "PyTorch was not found."


class MissingExtra(UserError):
    """An optional package is not installed: `package`, and the `extra` that installs it."""

    def __init__(self, package: str, extra: str, purpose: str):
        super().__init__(f"{purpose} needs {package}, which is not installed: "
                         f"pip install 'memagent-jax[{extra}]'")
        self.package, self.extra = package, extra


@contextlib.contextmanager
def needs(extra: str, purpose: str):
    """Imports in the block that find one of `EXTRAS[extra]` missing raise MissingExtra, whose
    message says "<purpose> needs <package> ...". Any other missing module (a dependency of an
    installed package: a broken installation, not a missing extra) propagates unchanged."""
    try:
        yield
    except ModuleNotFoundError as e:
        package = (e.name or "").partition(".")[0]
        if package not in EXTRAS[extra]:
            raise
        raise MissingExtra(package, extra, purpose) from None


def quiet_torch_notice() -> None:
    """Drops transformers' import-time notice that PyTorch is missing, and nothing else it
    logs. Must run before transformers is imported (it logs the notice once, at import)."""
    logging.getLogger("transformers").addFilter(
        lambda record: not record.getMessage().startswith(_TORCH_NOTICE))
