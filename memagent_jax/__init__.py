"""memagent-jax: MemAgent (chunk-by-chunk memory agent for long documents) on JAX."""

from memagent_jax import extras as _extras
from memagent_jax.distributed import startup as _startup

__version__ = "0.1.0"

# Here, so that it precedes every import of transformers, wherever it is made (extras.py).
_extras.quiet_torch_notice()
# Here, so that the CLI and every program using the package (the Python API) select the CPU
# before JAX starts where no accelerator is attached (no TPU runtime noise).
_startup.cpu_where_no_accelerator()
