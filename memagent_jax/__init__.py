"""memagent-jax: MemAgent (chunk-by-chunk memory agent for long documents) on JAX."""

__version__ = "0.1.0"
