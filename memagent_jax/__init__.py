"""memagent-jax: MemAgent (chunk-by-chunk memory agent for long documents) on JAX."""

from memagent_jax import extras as _extras

__version__ = "0.1.0"

# Here, so that it precedes every import of transformers, wherever it is made (extras.py).
_extras.quiet_torch_notice()
