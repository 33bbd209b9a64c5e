"""Decoding: the engine, sampling, the request scheduler (and, next, the MemAgent loop)."""
