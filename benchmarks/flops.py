"""Model FLOPs of a Qwen model's work: the one per-token FLOP model the benchmarks share
(train_step.py's utilisation, aot.py's TFLOP column, step_projection.py's step time).

PaLM's convention: a matmul of [m, k] @ [k, n] is 2 m k n FLOPs; a token's forward costs
2 x (the decoder layers' matmul weights) plus 4 L H D per position it attends to (QK^T and PV,
every layer) plus 2 x hidden x vocabulary where the LM head runs. Attention counts the whole
T x T square of a row of T tokens (the causal kernels skip most of the upper half; the measured
utilisations use the same count, so a time derived from them stays consistent). The embedding
gather, norms, activations and the optimiser are not counted.

`Work` is what a pass runs: tokens through the layers, positions attended (summed over those
tokens) and positions through the LM head; `forward` and `train` turn it into FLOPs.
"""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class Work:
    """tokens: through the decoder layers; attended: positions attended, summed over those
    tokens (a row of T tokens: T * T); head: positions through the LM head."""
    tokens: float = 0.0
    attended: float = 0.0
    head: float = 0.0

    def __add__(self, other: Work) -> Work:
        return Work(self.tokens + other.tokens, self.attended + other.attended,
                    self.head + other.head)

    def __mul__(self, k: float) -> Work:
        return Work(self.tokens * k, self.attended * k, self.head * k)

    __rmul__ = __mul__


def row(length: int, head: int) -> Work:
    """One row of `length` tokens whose LM head runs on `head` positions."""
    return Work(length, float(length) * length, head)


def model_shape(model, preset: str | None = None):
    """The ModelConfig a train config's `model` section names: its model.path's config.json
    where that directory is on this machine; else `preset` (a command's --preset),
    model.preset, or the preset the path's last component spells (~/ckpt/qwen3-4b and
    ~/models/Qwen3-4B-Instruct-2507: qwen3-4b); else Qwen2.5-7B (the first configs' model)."""
    from memagent_jax.models.loading import read_config
    from memagent_jax.models.presets import PRESETS, preset_config
    path = os.path.expanduser(model.path) if model.path else None
    if path and os.path.isdir(path):
        return read_config(path)
    name = preset or getattr(model, "preset", None)
    if name is None and path:
        base = os.path.basename(os.path.normpath(path)).lower()
        for suffix in ("-instruct-2507", "-thinking-2507", "-instruct", "-base", ""):
            if base.endswith(suffix) and base[:len(base) - len(suffix)] in PRESETS:
                name = base[:len(base) - len(suffix)]
                break
    return preset_config(name or "qwen2.5-7b")


def batch(rows: int, length: int, head: int) -> Work:
    """A [rows, length] micro-batch, each row's LM head on `head` positions (its window)."""
    return row(length, head) * rows


def layer_weights(config) -> int:
    """Matmul weights of one decoder layer (q, k, v, o and the gated MLP)."""
    c = config
    return (c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
            + 3 * c.hidden_size * c.intermediate_size)


def matmul_weights(config) -> int:
    """N of "2 N per token": the decoder layers' matmul weights (the LM head's counted apart)."""
    return config.num_layers * layer_weights(config)


def layers_forward(config, work: Work) -> float:
    """The decoder layers' forward FLOPs."""
    return 2 * matmul_weights(config) * work.tokens + attention_forward(config, work)


def attention_forward(config, work: Work) -> float:
    """The layers' attention products (QK^T and PV): their forward FLOPs."""
    c = config
    return 4 * c.num_layers * c.num_heads * c.head_dim * work.attended


def head_forward(config, work: Work) -> float:
    """The LM head's forward FLOPs."""
    return 2 * config.hidden_size * config.vocab_size * work.head


def forward(config, work: Work) -> float:
    """One forward pass (a log-prob pass, a prefill, a decode step)."""
    return layers_forward(config, work) + head_forward(config, work)


def adapter_weights(config, lora) -> int:
    """R of LoRA's "2 R per token": the adapters' weights, r (in + out) for each target
    projection of every layer (A [in, r], B [r, out]; models/lora.py)."""
    c = config
    q, kv, mlp = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    sizes = {"q": c.hidden_size + q, "k": c.hidden_size + kv, "v": c.hidden_size + kv,
             "o": q + c.hidden_size, "gate": c.hidden_size + mlp, "up": c.hidden_size + mlp,
             "down": mlp + c.hidden_size}
    return c.num_layers * lora.rank * sum(sizes[t] for t in lora.targets)


def train(config, work: Work, remat: str = "none", head_remat: bool = False,
          lora=None, merged: bool = True) -> float:
    """Forward and backward, plus what the backward recomputes: remat (models/qwen.py
    REMAT_POLICIES) "full" the layers' forward, "matmuls" their attention products (the
    projections' outputs are kept), "none" nothing; head_remat: the LM head's forward (the
    learner's logit chunks).

    Full-parameter (lora None): the backward is twice the forward (a matmul's input gradient and
    its weight gradient). With `lora` (a LoraConfig) the base is frozen, so no pass takes the
    gradient of a weight the adapters do not touch: the LM head's backward is its input
    gradient alone (once its forward). The target projections: `merged` (the learner's step,
    rl/learner.py: x (W + s A B)) differentiate through the merged weight, so they still
    take its [in, out] gradient, and A's and B's come from it; unmerged (x W + s (x A) B,
    as "LoRA Without Regret" counts) the backward of x W is its input gradient alone, the
    adapters' forward adds 2 R a token and their backward 4 R (d(xA), dB, dA, dx). The merge
    itself, 3 x 2 r in out per target weight a micro-batch (A B and its two gradients), is
    under 0.1% of a micro-batch of thousands of tokens and not counted."""
    def layers(work: Work, passes: float, adapters: float) -> float:
        return (passes * 2 * matmul_weights(config) * work.tokens
                + adapters * 2 * adapter_weights(config, lora) * work.tokens)
    head = head_forward(config, work)
    attention = attention_forward(config, work)
    if lora is None:
        forwards = forward(config, work) * 3
        layers_once = layers_forward(config, work)
    elif merged:
        forwards = layers_forward(config, work) * 3 + head * 2
        layers_once = layers_forward(config, work)
    else:  # x W: forward and input gradient; the adapters: 1 forward + 2 backward (6 R)
        forwards = layers(work, 2, 3) + attention * 3 + head * 2
        layers_once = layers(work, 1, 1) + attention
    recompute = {"none": 0.0, "matmuls": attention, "full": layers_once}[remat]
    return forwards + recompute + head * head_remat
