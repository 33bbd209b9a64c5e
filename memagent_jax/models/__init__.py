"""Qwen2.5 and Qwen3 (dense) in Flax NNX and their Hugging Face / Orbax files."""
