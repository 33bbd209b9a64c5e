"""Decoding: the engine's contract (`engine_api`), the engine, sampling, the request scheduler,
sizing, loading a model and building an engine (`factory`), and `generate`'s files (`jsonl`).
Nothing here knows of agents (rollout/ runs them on it)."""
