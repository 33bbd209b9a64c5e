"""Models shipped inside the package, addressable by name wherever a model path is taken:
`--model NAME` (`run`, `generate`, `demo`), `model.path: NAME` (`eval`, `train`),
`export --model NAME`, and in Python `load_model(NAME)`, `load_tokenizer(NAME)`
(`model_dir.resolve` finds them).

A shipped model is a Hugging Face directory here (config.json, model.safetensors, tokenizer
files, generation_config.json: it loads in `transformers` as it is) plus `memagent.json`, the
memory loop's budgets it was trained with (MemAgentConfig's fields), which `run` and `demo`
use unless given others. A directory on disk of the same name takes precedence.

`memagent-tiny` is the synthetic recipe's DAPO model (docs/synthetic.md): a Qwen2 of 128
hidden units and 4 layers over the synthetic tasks' word-level tokenizer, `demo`'s default.
"""
