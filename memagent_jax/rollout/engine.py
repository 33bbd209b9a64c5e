"""A JetStream-style decoding engine: prefill, insert into a slot, one step for all slots.

The engine owns a fixed number of decode slots, each with a KV cache of `max_len` entries. A
prompt is prefilled at a bucketed length (a prefix: its cache and last logits), up to
`prefill_rows` prompts in one call, inserted into a free slot (sampling that slot's first
token), and from then on every `generate` call advances all slots by one token. Shapes never
change after warm-up: slots, max_len, the prefill buckets and row counts are fixed, and the
three hot functions are jitted pure functions of the model state (from `nnx.split`) with the
decode state donated, so a step updates the cache in place.

Slots are split over the mesh's `data` axis and KV heads over `tensor`, like the parameters.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from memagent_jax.models.qwen2 import KVCache, Qwen2
from memagent_jax.models.sharding import partition_spec
from memagent_jax.rollout.sampling import SamplingParams, request_key, sample


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """slots: sequences decoded together; max_len: KV entries per slot (prompt + generated);
    prefill_buckets: prompt lengths compiled for (default: `default_buckets(max_len)`);
    prefill_rows: the most prompts prefilled in one call (compiled for 1, 2, 4, ... rows up to
    it, for every bucket: more rows, fewer and larger prefill calls, more to compile)."""
    slots: int = 8
    max_len: int = 2048
    prefill_buckets: tuple[int, ...] | None = None
    prefill_rows: int = 1

    def buckets(self) -> tuple[int, ...]:
        if self.prefill_buckets:
            return tuple(sorted(self.prefill_buckets))
        return default_buckets(self.max_len)

    def row_counts(self) -> tuple[int, ...]:
        """Row counts a prefill call is padded to: powers of two below prefill_rows, and it."""
        counts, r = [], 1
        while r < self.prefill_rows:
            counts.append(r)
            r *= 2
        return tuple(counts) + (self.prefill_rows,)


def default_buckets(max_len: int) -> tuple[int, ...]:
    """Powers of two from 16, four steps per octave from 1024 on (1024, 1280, 1536, 1792,
    2048, 2560, ...), then max_len. A long prompt pads by at most a quarter of its length
    rather than nearly double (MemAgent's 5-7K-token turns all fell in 8192 with powers of two);
    each bucket compiles once, when a prompt first needs it."""
    sizes, b = [], 16
    while b < max_len:
        sizes += [b] if b < 1024 else [b, b + b // 4, b + b // 2, b + 3 * b // 4]
        b *= 2
    return tuple(size for size in sizes if size < max_len) + (max_len,)


class Prefix(NamedTuple):
    """A prefilled prompt: keys, values (per layer [1, bucket, Hkv, D]), last_logits [1, V],
    length [] int32."""
    keys: tuple[jnp.ndarray, ...]
    values: tuple[jnp.ndarray, ...]
    last_logits: jnp.ndarray
    length: jnp.ndarray


class DecodeState(NamedTuple):
    """Everything a decode step reads, one row per slot ([S] unless noted)."""
    cache: KVCache            # per layer: keys [S, Hkv, D, max_len], values [S, Hkv, max_len, D]
    tokens: jnp.ndarray       # int32: the token each slot feeds next
    positions: jnp.ndarray    # int32: that token's position
    steps: jnp.ndarray        # int32: tokens generated so far (indexes the sampling key)
    keys: jnp.ndarray         # [S, 2] uint32: the slot's request key
    temperature: jnp.ndarray  # float32
    top_p: jnp.ndarray        # float32
    top_k: jnp.ndarray        # int32


class Engine:
    """Decoding over `config.slots` slots for one model; see the module docstring."""

    def __init__(self, model: Qwen2, config: EngineConfig = EngineConfig(),
                 mesh: jax.sharding.Mesh | None = None):
        if config.max_len < 2 or config.slots < 1 or config.prefill_rows < 1:
            raise ValueError(f"invalid engine config {config}")
        self.config = config
        self.model_config = model.config
        self.mesh = mesh
        self.dtype = model.dtype
        self.graphdef, params = nnx.split(model)
        # The parameters are kept, and passed to the jitted functions, as a flat list:
        # flattening an nnx.State is Python work per leaf (250 us per call for a 28-layer model
        # on a CPU, the time of a whole decode step for a small model on a GPU), and a decode
        # step is one call.
        self._param_leaves, self._param_treedef = jax.tree.flatten(params)
        self.buckets = config.buckets()
        self.prefill_count = 0  # prompts prefilled so far (tests count these)
        self._state_sharding = self._decode_state_sharding()
        self._prefill = jax.jit(self._prefill_fn)
        self._insert = jax.jit(self._insert_fn, donate_argnums=(1,),
                               out_shardings=(self._state_sharding, None, None))
        self._generate = jax.jit(self._generate_fn, donate_argnums=(1,),
                                 out_shardings=(self._state_sharding, None, None))

    @property
    def params(self) -> nnx.State:
        """The parameters decoded with, as `nnx.split(model)` gives them."""
        return jax.tree.unflatten(self._param_treedef, self._param_leaves)

    # ---- the three operations -------------------------------------------------------------

    def init_decode_state(self) -> DecodeState:
        """All slots empty (their rows are computed but ignored until something is inserted)."""
        slots, length = self.config.slots, self.config.max_len
        state = DecodeState(
            cache=KVCache.zeros(self.model_config, slots, length, self.dtype),
            tokens=jnp.zeros(slots, jnp.int32), positions=jnp.zeros(slots, jnp.int32),
            steps=jnp.zeros(slots, jnp.int32), keys=jnp.zeros((slots, 2), jnp.uint32),
            temperature=jnp.zeros(slots, jnp.float32), top_p=jnp.ones(slots, jnp.float32),
            top_k=jnp.zeros(slots, jnp.int32))
        # Committed to its sharding, like every later state, so the first insert does not
        # compile a variant of its own.
        return jax.device_put(state, self._state_sharding)

    def prefill(self, prompt_ids: list[int] | np.ndarray) -> Prefix:
        """Runs a prompt (1 <= len <= max_len - 1) through the model at its bucket length."""
        return self.prefill_batch([prompt_ids])[0]

    def prefill_batch(self, prompts: list[list[int] | np.ndarray]) -> list[Prefix]:
        """Prefills up to `prefill_rows` prompts in one call, all at the bucket of the longest
        (rows padded to a compiled row count); returns one single-row Prefix per prompt."""
        if not 1 <= len(prompts) <= self.config.prefill_rows:
            raise ValueError(f"prefill_batch takes 1 to {self.config.prefill_rows} prompts, "
                             f"got {len(prompts)}")
        bucket = self.bucket_for(max(len(p) for p in prompts))
        rows = next(r for r in self.config.row_counts() if r >= len(prompts))
        ids = np.zeros((rows, bucket), np.int32)
        lengths = np.ones(rows, np.int32)  # padding rows: one token, never read
        for row, prompt in enumerate(prompts):
            ids[row, :len(prompt)] = prompt
            lengths[row] = len(prompt)
        self.prefill_count += len(prompts)
        prefixes = self._prefill(self._param_leaves, jnp.asarray(ids), jnp.asarray(lengths))
        return prefixes[:len(prompts)]

    def insert(self, prefix: Prefix, state: DecodeState, slot: int, sampling: SamplingParams,
               sample_index: int = 0) -> tuple[DecodeState, int, float]:
        """Puts a prefix into `slot` and samples its first token with the key of sample
        `sample_index` of a request seeded `sampling.seed` (required here; the scheduler draws
        one for requests without). Returns (state, first token, its logprob). `state` is
        donated: use the returned one."""
        params = (request_key(sampling.seed, sample_index), jnp.float32(sampling.temperature),
                  jnp.float32(sampling.top_p), jnp.int32(sampling.top_k))
        state, token, logprob = self._insert(prefix, state, jnp.int32(slot), *params)
        return state, token, logprob

    def generate(self, state: DecodeState) -> tuple[DecodeState, jnp.ndarray, jnp.ndarray]:
        """One token for every slot: (state, tokens [S] int32, logprobs [S] float32)."""
        return self._generate(self._param_leaves, state)

    def update_params(self, params: nnx.State) -> None:
        """Decodes with new parameter values from now on (a learner's updated state).

        The arrays are used as they are: they must match the current ones in structure, shape,
        dtype and sharding, so the swap never copies, reshards or recompiles; a mismatch raises
        ValueError rather than silently moving weights between devices."""
        if jax.tree.structure(params) != self._param_treedef:
            raise ValueError("update_params: the new state's structure differs from the model's")
        for (path, b), a in zip(jax.tree.leaves_with_path(params), self._param_leaves):
            if (a.shape, a.dtype) != (b.shape, b.dtype) or a.sharding != b.sharding:
                raise ValueError(f"update_params: {jax.tree_util.keystr(path)} is "
                                 f"{b.dtype}{list(b.shape)} on {b.sharding}, the engine's is "
                                 f"{a.dtype}{list(a.shape)} on {a.sharding}")
        self._param_leaves = jax.tree.leaves(params)

    # ---- helpers --------------------------------------------------------------------------

    def bucket_for(self, length: int) -> int:
        for bucket in self.buckets:
            if length <= bucket:
                return bucket
        raise ValueError(f"prompt of {length} tokens exceeds the largest bucket "
                         f"{self.buckets[-1]}")

    def warm_up(self, prompt_lengths: list[int] | None = None) -> None:
        """Compiles the prefill (at every row count) and insert of the buckets that prompts of
        `prompt_lengths` tokens use (default: every bucket), and the decode step."""
        buckets = (self.buckets if prompt_lengths is None
                   else sorted({self.bucket_for(n) for n in prompt_lengths}))
        state = self.init_decode_state()
        for bucket in buckets:
            prompt = [0] * min(bucket, self.config.max_len - 1)
            for rows in self.config.row_counts():
                prefix = self.prefill_batch([prompt] * rows)[0]
            state, _, _ = self.insert(prefix, state, 0, SamplingParams(temperature=0.0, seed=0))
        self.prefill_count = 0
        jax.block_until_ready(self.generate(state))

    def _decode_state_sharding(self) -> DecodeState:
        layers = self.model_config.num_layers
        if self.mesh is None:
            device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
            return DecodeState(KVCache((device,) * layers, (device,) * layers), *[device] * 7)
        c, slots, length = self.model_config, self.config.slots, self.config.max_len
        spec = functools.partial(partition_spec, mesh=self.mesh)
        # Keys and values differ only in the order of their last two, unsplit, dimensions.
        cache = NamedSharding(self.mesh, spec((slots, c.num_kv_heads, length, c.head_dim),
                                              ("batch", "kv_heads", None, None)))
        row = NamedSharding(self.mesh, spec((slots,), ("batch",)))
        keys = NamedSharding(self.mesh, spec((slots, 2), ("batch", None)))
        return DecodeState(KVCache((cache,) * layers, (cache,) * layers), row, row, row, keys,
                           row, row, row)

    # ---- pure functions (jitted in __init__) -----------------------------------------------

    def _model(self, param_leaves) -> Qwen2:
        return nnx.merge(self.graphdef, jax.tree.unflatten(self._param_treedef, param_leaves))

    def _prefill_fn(self, param_leaves, ids, lengths) -> list[Prefix]:
        """ids [R, bucket] right-padded, lengths [R] -> R single-row prefixes. Split here, so
        that insert sees one prefix shape per bucket whatever the row count."""
        model = self._model(param_leaves)
        logits, keys, values = model.prefill(ids, logits_index=lengths - 1)
        return [Prefix(tuple(k[r:r + 1] for k in keys), tuple(v[r:r + 1] for v in values),
                       logits[r:r + 1], lengths[r]) for r in range(ids.shape[0])]

    def _insert_fn(self, prefix: Prefix, state: DecodeState, slot, key, temperature, top_p,
                   top_k):
        token, logprob = sample(prefix.last_logits, temperature[None], top_p[None], top_k[None],
                                key[None], jnp.zeros(1, jnp.int32))

        state = DecodeState(
            cache=state.cache.write_prefix(prefix.keys, prefix.values, slot),
            tokens=state.tokens.at[slot].set(token[0]),
            positions=state.positions.at[slot].set(prefix.length),
            steps=state.steps.at[slot].set(1),
            keys=state.keys.at[slot].set(key),
            temperature=state.temperature.at[slot].set(temperature),
            top_p=state.top_p.at[slot].set(top_p),
            top_k=state.top_k.at[slot].set(top_k))
        return state, token[0], logprob[0]

    def _generate_fn(self, param_leaves, state: DecodeState):
        model = self._model(param_leaves)
        logits, cache = model.decode_step(state.tokens, state.positions, state.cache)
        tokens, logprobs = sample(logits, state.temperature, state.top_p, state.top_k,
                                  state.keys, state.steps)
        # A free slot keeps stepping; clamping keeps its writes inside the cache.
        positions = jnp.minimum(state.positions + 1, self.config.max_len - 1)
        state = state._replace(cache=cache, tokens=tokens, positions=positions,
                               steps=state.steps + 1)
        return state, tokens, logprobs
