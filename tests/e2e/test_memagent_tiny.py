"""The shipped agent, `memagent-tiny` (memagent_jax/pretrained; trained by the synthetic recipe,
docs/synthetic.md): addressed by name, a Qwen2 that `transformers` loads with our logits, and a
memory agent that answers fresh multikey documents of 8K tokens (a seed no training or
evaluation set of the recipe used)."""

import os

import jax.numpy as jnp
import numpy as np
import pytest

from memagent_jax import pretrained
from memagent_jax.models import load_model, read_config
from memagent_jax.rollout.agent import ModelSection, build_agent, load_policy
from memagent_jax.rollout.engine import EngineConfig
from memagent_jax.rollout.memagent import MemAgentConfig
from memagent_jax.rollout.sampling import SamplingParams
from memagent_jax.synthetic import tasks as synthetic
from memagent_jax.tokenizer import load_tokenizer
from tests.hf_reference import hf_logits

NAME = "memagent-tiny"
FRESH_SEED = 424242  # the recipe's data: seeds 1, 3 and 5 train, 2 validates, 9-11 evaluate
DOCUMENTS = 16
# Correct answers of the 16: the shipped model answers 14 (and 97 % of multikey questions at
# 8K, 94 % of 256 fresh ones, docs/synthetic.md; the model shipped before it 15); the recipe's
# step-2 model, which does not yet copy from anywhere in its prompt, 0, as a random one; an
# agent that keeps the last fact it reads, one in four. Two below 14 leave room for the last
# bits of another CPU's arithmetic, not for a model that does not answer (12 of 16 by chance
# at one in four: 4e-5).
AT_LEAST = 12


def test_it_is_shipped_and_loads_in_transformers_with_our_logits():
    from transformers import AutoModelForCausalLM

    assert NAME in pretrained.names()
    path = pretrained.resolve(NAME)
    model, config = load_model(path)
    ids = np.random.RandomState(0).randint(0, config.vocab_size, (2, 96))
    ours = np.asarray(model(jnp.asarray(ids)))
    reference = hf_logits(AutoModelForCausalLM.from_pretrained(path, dtype="float32"), ids)
    # f32 rounding grows with the activations: a trained model's logits reach ~18 here (a
    # tiny random model's ~1, where the project's bound is 1e-4), and the two frameworks
    # differ by up to 1.6e-4. The bound scales with the largest logit.
    assert np.abs(ours - reference).max() <= 2e-5 * max(1.0, np.abs(reference).max())
    assert (ours.argmax(-1) == reference.argmax(-1)).all()


def test_the_python_api_takes_its_name_as_the_commands_do(monkeypatch):
    path = pretrained.resolve(NAME)
    _, config = load_model(NAME)
    assert config == read_config(NAME) == read_config(path)
    monkeypatch.setenv("HOME", os.path.dirname(path))
    assert read_config(f"~/{NAME}") == config  # as the README's load_model("~/ckpt/...")
    assert load_tokenizer(NAME).vocab == load_tokenizer(path).vocab
    assert pretrained.budgets(NAME) == pretrained.budgets(path) != {}


@pytest.mark.slow
def test_it_answers_fresh_8k_multikey_documents_by_name():
    section = ModelSection(path=NAME)
    tokenizer = section.load_tokenizer(required=True)
    policy = load_policy(section, tokenizer)
    config = MemAgentConfig(**pretrained.budgets(section.path))
    agent = build_agent(policy.model, tokenizer, config, EngineConfig(slots=DOCUMENTS), None,
                        policy.stop_ids)
    documents = [synthetic.make_sample("multikey", 8192, FRESH_SEED, i)
                 for i in range(DOCUMENTS)]
    samples = [agent.read(d.question, d.context) for d in documents]
    groups = agent.run(policy.params, samples, SamplingParams(0.0))
    answers = [(trajectory.answer or "").strip() for (trajectory,) in groups]
    assert all(len(trajectory.turns) == 8192 // config.chunk_tokens + 1
               for (trajectory,) in groups)
    correct = sum(a == d.answer for a, d in zip(answers, documents))
    assert correct >= AT_LEAST, list(zip(answers, [d.answer for d in documents]))
