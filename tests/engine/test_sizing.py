"""Sizes checked before an engine allocates (`engine.sizing`, through `build_engine`): a KV
length beyond the model's context window or the devices' memory is one line naming the flag
or config key that asked for it, and `run` sizes its cache from the document, not the flag."""

import json

import jax
import pytest

from memagent_jax.agents.memagent.agent import MemAgent
from memagent_jax.agents.memagent.config import MemAgentConfig
from memagent_jax.cli import main
from memagent_jax.engine import engine as engine_module
from memagent_jax.engine import factory
from memagent_jax.engine.engine import Engine
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.errors import ConfigError
from memagent_jax.models.config import ModelConfig
from memagent_jax.models.loading import random_model
from memagent_jax.models.qwen import split_params
from memagent_jax.models.sharding import make_mesh
from memagent_jax.rollout.runner import build_runner
from memagent_jax.tokenizer import load_tokenizer
from tests.hf_reference import write_hf_model, write_tiny_tokenizer

pytestmark = pytest.mark.slow  # engines compiled to measure them

PREFIX = "memagent-jax: error: "
SMALL = ModelConfig(vocab_size=101, hidden_size=32, intermediate_size=48, num_layers=1,
                    num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=4096)
WINDOW = "over the model's context window of 512 tokens (config.json max_position_embeddings)"


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"prompt_ids": [5, 6, 7]}) + "\n")
    return str(path)


@pytest.fixture
def doc(tmp_path):
    path = tmp_path / "doc.txt"
    path.write_text("hello world the answer is memory " * 10)  # 60 tokens
    return str(path)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(PREFIX), err
    return err[0][len(PREFIX):]


def test_generate_max_len_beyond_the_window_is_refused(model_dir, prompts, tmp_path, capsys):
    assert main(["generate", "--model", model_dir, "--input", prompts, "--out",
                 str(tmp_path / "o.jsonl"), "--max-len", "1024"]) == 2
    assert _one_line(capsys) == f"--max-len 1024: {WINDOW}"


def test_serve_max_len_beyond_the_window_is_refused(model_dir, capsys):
    assert main(["serve", "--model", model_dir, "--max-len", "1024", "--port", "0"]) == 2
    assert _one_line(capsys) == f"--max-len 1024: {WINDOW}"


def test_run_budgets_beyond_the_window_name_the_flag(model_dir, doc, capsys):
    assert main(["run", "--model", model_dir, "--doc", doc, "--question", "what is the answer",
                 "--max-memory-tokens", "2000"]) == 2
    line = _one_line(capsys)
    assert line.startswith("--max-memory-tokens 2000 makes turns of up to ") and WINDOW in line
    assert "memory 2000 + chunk 60 + reply 2000" in line  # the document's one chunk


def test_run_sizes_the_cache_from_the_document_not_the_flag(model_dir, doc, capsys,
                                                            monkeypatch):
    lengths = []
    build = engine_module.Engine

    def engine(model, config, mesh=None):
        lengths.append(config.max_len)
        return build(model, config, mesh)

    monkeypatch.setattr(engine_module, "Engine", engine)
    assert main(["run", "--model", model_dir, "--doc", doc, "--question", "what is the answer",
                 "--chunk-tokens", "100000", "--max-memory-tokens", "4",
                 "--max-final-tokens", "4", "--temperature", "0"]) == 0
    assert len(lengths) == 1 and lengths[0] <= 256  # template + question + 60 + 2 x 4


def test_a_cache_beyond_the_devices_memory_is_refused_before_it_is_allocated(tmp_path, prompts,
                                                                            capsys):
    # A window nothing refuses, and a slot of 10^12 tokens (one prompt): terabytes of KV cache.
    model = write_hf_model(tmp_path / "long", seed=3, max_position_embeddings=10 ** 12)
    capsys.readouterr()
    assert main(["generate", "--model", model, "--input", prompts, "--out",
                 str(tmp_path / "o.jsonl"), "--max-len", str(10 ** 12)]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"--max-len {10 ** 12}: "), line
    assert (" TiB per device (the KV cache of 1 slot x 1000000000000 tokens, the decode "
            "step's sampling arrays and the weights) is over the ") in line, line


def test_a_config_budget_beyond_the_window_names_its_key(tmp_path):
    tokenizer_dir = tmp_path / "tok"
    write_tiny_tokenizer(tokenizer_dir)
    model = random_model(SMALL)
    with pytest.raises(ConfigError) as error:
        build_runner(MemAgent(MemAgentConfig(chunk_tokens=5000, max_memory_tokens=64)), model,
                     load_tokenizer(str(tokenizer_dir)), EngineConfig(slots=2), None, (2,))
    assert error.value.key == "memagent.chunk_tokens"
    assert str(error.value).startswith("memagent.chunk_tokens: 5000 makes turns of up to ")
    assert "over the model's context window of 4096 tokens" in str(error.value)



def test_an_engine_max_len_below_memagents_turns_is_refused_before_any_allocation(
        tmp_path, monkeypatch):
    """MemAgent's default budgets (chunks of 5,000) on an engine of 1,024: one line naming
    engine.max_len and what the turns need, before an engine is built."""
    tokenizer_dir = tmp_path / "tok"
    write_tiny_tokenizer(tokenizer_dir)
    tokenizer, model = load_tokenizer(str(tokenizer_dir)), random_model(SMALL)
    monkeypatch.setattr(engine_module, "Engine", None)  # building one would fail otherwise
    with pytest.raises(ConfigError) as error:
        build_runner(MemAgent(MemAgentConfig()), model, tokenizer,
                     EngineConfig(slots=1, max_len=1024), None, (2,))
    assert error.value.key == "engine.max_len"
    assert str(error.value).startswith("engine.max_len: 1024 is below the agent's longest "
                                       "turn: memagent.chunk_tokens 5000 makes turns of up to ")

@pytest.mark.parametrize("axes", [None, {"data": 2, "fsdp": 1, "tensor": 4}])
def test_device_bytes_are_what_one_device_holds_once_allocated(axes):
    mesh = axes and make_mesh(axes)
    model = random_model(SMALL, mesh=mesh)
    engine = Engine(model, EngineConfig(slots=4, max_len=64), mesh)
    estimate = engine.device_bytes()
    state = engine.init_decode_state(64)  # the longest cache, and one layer twice (a resize)
    held = jax.tree.leaves((split_params(model)[1], state, state.cache.k[0], state.cache.v[0]))
    assert estimate == sum(a.addressable_shards[0].data.nbytes for a in held)


def test_the_decode_steps_sampling_arrays_are_estimated_from_xlas_own_count():
    """`Engine.step_bytes` (the [slots, vocabulary] arrays the memory check adds to the state)
    against XLA's temporaries for a decode step whose vocabulary dominates them: 0.81 of the
    estimate, which the check must not exceed, nor fall far below (margin: 0.6 to 1)."""
    config = ModelConfig(vocab_size=4096, hidden_size=32, intermediate_size=48, num_layers=1,
                         num_heads=4, num_kv_heads=2, head_dim=8)
    engine = Engine(random_model(config), EngineConfig(slots=256, max_len=64))
    temporaries = engine.compiled()["decode step"].memory_analysis().temp_size_in_bytes
    assert 0.6 * engine.step_bytes() < temporaries <= engine.step_bytes()


def test_a_step_whose_sampling_arrays_do_not_fit_is_refused(monkeypatch):
    """The state fits, the state and the decode step's sampling arrays do not: refused (the
    check counted the state alone, and 100,000 slots of memagent-tiny passed it, then took
    7.6 GiB more); on CPU, against the memory this process can use, not the machine's."""
    from memagent_jax.engine import sizing
    model = random_model(SMALL)
    engine = Engine(model, EngineConfig(slots=4096, max_len=16))
    state, step = engine.device_bytes(), engine.step_bytes()
    monkeypatch.setattr(sizing, "usable_memory", lambda: state + step // 2)
    with pytest.raises(ConfigError) as error:
        factory.build_engine(model, EngineConfig(slots=4096), None, 16)
    assert "the KV cache of 4096 slots x 16 tokens, the decode step's sampling arrays and the " \
           "weights) is over the " in str(error.value)
    assert str(error.value).endswith("of host memory this process can use; lower it or the "
                                     "number of slots, or split the weights over mesh.tensor "
                                     "(the engine splits them over tensor only)")
    monkeypatch.setattr(sizing, "usable_memory", lambda: state + step)
    factory.build_engine(model, EngineConfig(slots=4096), None, 16)


def test_generate_decodes_no_more_slots_than_it_has_prompts(model_dir, prompts, tmp_path,
                                                            monkeypatch):
    """--slots 100000 for one prompt: an engine of one slot (100,000 took 6 GB and minutes
    for 2 prompts)."""
    slots = []

    def engine(model, config, mesh=None):
        slots.append(config.slots)
        assert config.slots <= 8, "an engine of more slots than prompts"
        return Engine(model, config, mesh)

    monkeypatch.setattr(engine_module, "Engine", engine)
    assert main(["generate", "--model", model_dir, "--input", prompts, "--out",
                 str(tmp_path / "o.jsonl"), "--slots", "100000", "--max-new-tokens", "4"]) == 0
    assert slots == [1]
