"""step_projection.py (tested beside it, with the benchmarks it shares helpers with): the RL
step's time on paper for the 7B and Qwen3-4B configs,
its update FLOPs against a hand count, and a config it cannot read refused in one line naming
the key."""

import dataclasses
import os

import numpy as np
import pytest
import step_projection  # beside this file: pytest puts its directory on the path

from memagent_jax.rl.config import load_train_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GPU8 = os.path.join(ROOT, "configs/train/qwen2.5-7b_gpu8.yaml")
TPU = os.path.join(ROOT, "configs/train/qwen2.5-7b_tpu_v5p.yaml")
QWEN3_GPU8 = os.path.join(ROOT, "configs/train/qwen3-4b_gpu8.yaml")
QWEN3_TPU = os.path.join(ROOT, "configs/train/qwen3-4b_tpu_v5p.yaml")
QWEN2_7B = "model: 28 layers, hidden 3584, 28/4 heads"
QWEN3_4B = "model: 36 layers, hidden 2560, 32/8 heads"  # the preset its model.path names


@pytest.mark.slow
@pytest.mark.parametrize("path, target, model", [
    (GPU8, "8 x NVIDIA H100", QWEN2_7B), (TPU, "32 x TPU v5p", QWEN2_7B),
    (QWEN3_GPU8, "8 x NVIDIA H100", QWEN3_4B), (QWEN3_TPU, "16 x TPU v5p", QWEN3_4B)],
    ids=["gpu8", "tpu_v5p", "qwen3-4b_gpu8", "qwen3-4b_tpu_v5p"])
def test_the_7b_and_4b_configs_project_a_step_beside_the_original(path, target, model, capsys):
    step_projection.main(["--config", path])
    out = capsys.readouterr().out
    assert target in out.splitlines()[0]
    assert out.splitlines()[1].startswith(model)
    for line in ("rollout: ", "  update 1 ", "  final ", "old log-probs",
                 "KL reference (forward)", "train (forward + backward)", "step: ",
                 "original (BytedTsinghua-SIA/MemAgent #31): ~2400 s a step, ~2100 s"):
        assert line in out, line
    # Every rate is printed beside where it comes from.
    assert out.count("measured: ") + out.count("assumed: ") >= 4


# Qwen2.5-7B by hand: each layer's q, k, v, o (3584 x 128 x (2 x 28 + 2 x 4)) and gated MLP
# (3 x 3584 x 18944) weights, 28 layers; the LM head 3584 x 152064; attention 4 L H D a position.
N = 28 * (3584 * 128 * 64 + 3 * 3584 * 18944)
ATTENTION = 4 * 28 * 28 * 128
HEAD = 2 * 3584 * 152064


def forward_by_hand(tokens, attended, head):
    return 2 * N * tokens + ATTENTION * attended + HEAD * head


def test_update_flops_equal_a_hand_count():
    s = step_projection.setup(load_train_config(GPU8, ["learner.old_logprobs=recompute",
                                                       "learner.remat=full"]))
    # Two rows: 5000 + 500 and 1000 + 24 tokens, one trajectory's two turns.
    rows = step_projection.Rows(np.array([5000, 1000]), np.array([500, 24]), np.array([0, 0]),
                                np.array([0, 1]), np.array([False, True]))
    s = dataclasses.replace(s, rows=rows)
    real = step_projection.update_passes(s, step_projection.real)
    forward = forward_by_hand(5500 + 1024, 5500 ** 2 + 1024 ** 2, 524)
    assert real["old log-probs (forward)"] == (6524, pytest.approx(forward, rel=1e-12))
    assert real["KL reference (forward)"][1] == pytest.approx(forward, rel=1e-12)
    # Forward + backward (3 forwards), remat's forward of the layers, the logit chunks' head.
    assert real["train (forward + backward)"][1] == pytest.approx(4 * forward, rel=1e-12)
    # Saving the matmuls' outputs, the backward recomputes only the attention products;
    # without remat, nothing of the layers.
    attention = ATTENTION * (5500 ** 2 + 1024 ** 2)
    for remat, recomputed in (("matmuls", attention + HEAD * 524), ("none", HEAD * 524)):
        lean = dataclasses.replace(s, config=dataclasses.replace(
            s.config, learner=dataclasses.replace(s.config.learner, remat=remat)))
        train = step_projection.update_passes(lean, step_projection.real)
        assert train["train (forward + backward)"][1] == pytest.approx(
            3 * forward + recomputed, rel=1e-12)

    # As the learner pads: both rows in one micro-batch at the longest one's bucket (6144 of the
    # config's), its rows a multiple of data x fsdp = 4, the LM head on a window of the longest
    # response rounded up to a power of two.
    padded = step_projection.update_passes(s, step_projection.padded)
    by_hand = forward_by_hand(4 * 6144, 4 * 6144 ** 2, 4 * 512)
    assert padded["old log-probs (forward)"] == (4 * 6144, pytest.approx(by_hand, rel=1e-12))
    assert padded["train (forward + backward)"][1] == pytest.approx(4 * by_hand, rel=1e-12)

    # The rollout's final turn, in the engine's layout (models/sharding.py ROLLOUT_RULES): its
    # 1000-token prompt prefilled at the config's 1024 bucket, one row, which splits over no
    # slot group: on one tensor pair (2 chips); its 24 tokens decoded over the engine's cache,
    # as long as the longest turn needs (here 5524 tokens: 5888), of 28 x 4 x 128 keys and
    # values in bf16 held once over all 8 chips; a ragged read would take each slot's filled
    # cache (1000 + 1 up to 1000 + 24 positions); and a step's weights (a chip's copy, split
    # over tensor: 1/2 of the bf16 weights) are shared by the 128 slots.
    final = step_projection.rollout_turns(s)[-1]
    assert final["turn"] == "final"
    assert final["prefill_flops"] == pytest.approx(forward_by_hand(1024, 1024 ** 2, 1))
    assert final["prefill_s"] == pytest.approx(final["prefill_flops"] / (2 * 0.317 * 670e12))
    position = 2 * 2 * 28 * 4 * 128 / 8
    weights = 24 * 2 * (N + 2 * 3584 * 152064) / 2 / 128
    assert s.cache_length == 7424  # the longest of the generated turns (7,2xx tokens)
    s = dataclasses.replace(s, cache_length=5888)
    final = step_projection.rollout_turns(s)[-1]
    assert final["decode_s"] == pytest.approx((24 * 5888 * position + weights) / 1723e9)
    ragged = (24 * 1000 + 24 * 25 / 2) * position
    assert final["decode_ragged_s"] == pytest.approx((ragged + weights) / 1723e9)
    # Every chip gathers the prefix of the other slot groups' (3 of 4) rows: 1024 positions.
    assert final["gathered"] == pytest.approx(1024 * 8 * position * 3 / 4 / 8 * 4)


def test_prefill_calls_take_prefill_rows_at_the_longest_ones_bucket():
    """The config's 4 rows a call: 4 prompts padded to the longest one's bucket, their rows
    split over data x fsdp = 4 slot groups, each on its tensor pair: all 8 chips; the 5th
    alone, at its own bucket, on 2."""
    s = step_projection.setup(load_train_config(GPU8))
    calls = step_projection.prefill_calls(s, np.array([5300, 6300, 5000, 1000, 900]))
    assert calls == [(4, 4, 6400), (1, 1, 1024)]
    assert [step_projection.split_rows(rows, s.axes) for _, rows, _ in calls] == [4, 1]


@pytest.mark.parametrize("override, key", [("memagent.max_chunks=null", "memagent.max_chunks"),
                                           ("mesh.fsdp=-1", "mesh.fsdp"),
                                           ("model.attention=xla", "model.attention")])
def test_a_config_it_cannot_read_is_one_line_naming_the_key(override, key):
    with pytest.raises(SystemExit) as exit:
        step_projection.main(["--config", GPU8, override])
    message = str(exit.value.code)
    assert message.startswith(f"error: {key}: ") and "\n" not in message


# LoRA rank 8 on every linear layer by hand: r (in + out) for q, k, v, o, gate, up, down.
R = 28 * 8 * ((3584 + 3584) * 2 + (3584 + 512) * 2 + (3584 + 18944) * 3)


@pytest.mark.slow
def test_lora_update_flops_equal_a_hand_count(capsys):
    """Two rows as above, remat full, logit chunks: the merged LoRA step (the learner's) takes
    every layer weight's gradient but not the frozen LM head's; unmerged, neither (the
    adapters' forward 2 R a token, backward 4 R); full-parameter, both."""
    s = step_projection.setup(load_train_config(GPU8, ["learner.remat=full",
                                                       "learner.lora={rank: 8, alpha: 16}"]))
    rows = step_projection.Rows(np.array([5000, 1000]), np.array([500, 24]), np.array([0, 0]),
                                np.array([0, 1]), np.array([False, True]))
    s = dataclasses.replace(s, rows=rows)
    tokens, attended, head = 5500 + 1024, ATTENTION * (5500 ** 2 + 1024 ** 2), HEAD * 524
    layers = 2 * N * tokens + attended
    by_hand = {"as configured": 4 * layers + 2 * head + head,
               "full-parameter": 4 * forward_by_hand(tokens, 5500 ** 2 + 1024 ** 2, 524),
               "LoRA unmerged": (4 * N + 6 * R) * tokens + 3 * attended + 2 * head
                                + (2 * N + 2 * R) * tokens + attended + head}
    for trained, flops in by_hand.items():
        passes = step_projection.update_passes(s, step_projection.real, trained)
        assert passes["train (forward + backward)"][1] == pytest.approx(flops, rel=1e-12), trained
    # Without remat, unmerged LoRA's forward and backward is about two thirds of full's
    # ("LoRA Without Regret"): 4 N + 6 R of 6 N a token, beside attention and the head.
    assert pytest.approx(0.670, abs=1e-3) == (4 * N + 6 * R) / (6 * N)

    step_projection.main(["--config", GPU8, "learner.lora={rank: 8, alpha: 16}"])
    out = capsys.readouterr().out
    assert "LoRA (rank 8, q, k, v, o, gate, up, down)" in out
    for trained in ("full-parameter", "LoRA unmerged"):
        assert f"    {trained}: chip-seconds a step (of #31's): padded " in out, trained
