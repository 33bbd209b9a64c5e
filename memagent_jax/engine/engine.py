"""A JetStream-style decoding engine: prefill, insert into a slot, one step for all slots.

`Engine` implements `engine.engine_api.DecodeEngine` (the contract, its config and types) for
a Qwen model. It owns a fixed number of decode slots, each with a KV
cache of up to `max_len` entries. The cache is only as long as the longest busy slot needs, in
a few compiled lengths (`EngineConfig.cache_lengths`): a step reads all of its cache (or, where
the busy slots fill little of it, each slot to its own position: `RAGGED_READS`), so it
costs what the filled part costs whatever max_len is, and the cache grows (or shrinks, once the
need has halved) between steps, one layer at a time, so a resize holds one layer's extra copy.
Shapes are otherwise fixed: slots, the prefill buckets and row counts, and the three hot
functions are jitted pure functions of the parameters with the decode state donated, so a step
updates the cache in place.

The engine has its own layout on the job's mesh (`models.sharding.ROLLOUT_RULES`): weights in
the compute dtype split over `tensor` only, slots, their KV cache and prefill rows split over
`data` x `fsdp`, KV heads over `tensor`; where the model's KV heads do not divide `tensor`,
the slots are split over it too (attention data-parallel, as tpu-inference's dp attention:
each chip attends for its own slots with every head, so no KV entry is held twice; the
heads' projections stay split). `place(params)` makes the engine's copy from parameters in any
layout and dtype (the learner's, a loaded model's), a weight at a time on the devices; the
jitted functions take only that layout.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from memagent_jax.engine.engine_api import DecodeState, EngineConfig, Prefix, StepLogprobs
from memagent_jax.engine.sampling import SamplingParams, request_key, sample, top_logprobs
from memagent_jax.models.attention import attend_cache_ragged
from memagent_jax.models.cache_kernels import attend_cache_ragged_gpu, attend_cache_ragged_tpu
from memagent_jax.models.qwen import KVCache, Params, Qwen, ReadCacheFn, split_params
from memagent_jax.models.sharding import ROLLOUT_RULES, SLOT_AXES, param_shardings, partition_spec

# The share of the cache the busy slots fill together below which a decode step reads each
# slot to its own length: on CPU the ragged read's loops cost a tenth more than the dense read
# where the slots fill half of it (Qwen2.5-0.5B shapes; several times more for memagent-tiny's),
# and win where one long slot sits beside short ones (benchmarks/decode_ragged.py). The GPU and
# TPU kernels take the same rule until that benchmark has run on them.
RAGGED_BELOW = 0.25

# The decode step's temporaries that grow with its slots: the logits and the sampler's arrays
# over them, this many float32 [slots, vocabulary] arrays at once in XLA's buffer assignment
# (`compiled()`'s memory_analysis: 4.2 of them for memagent-tiny's shapes, 5.0 for Qwen2.5-0.5B's
# and Qwen3-0.6B's, in float32). 100,000 slots of memagent-tiny hold 7.6 GiB of them.
SAMPLING_ARRAYS = 5

# The ragged read by platform: XLA loops on CPU, a Pallas kernel on TPU and GPU.
RAGGED_READS: dict[str, ReadCacheFn] = {"cpu": attend_cache_ragged,
                                        "tpu": attend_cache_ragged_tpu,
                                        "gpu": attend_cache_ragged_gpu}


class Engine:
    """`DecodeEngine` for a Qwen model; see the module docstring.

    model: gives the structure, config, compute dtype and attention, and the shapes, dtypes
    and shardings every `params` passed in must have (its own arrays are not kept).
    config.max_len must be set (`EngineConfig.sized_for`). mesh: the mesh the parameters are
    sharded on, or None for a model on one device."""

    def __init__(self, model: Qwen, config: EngineConfig, mesh: jax.sharding.Mesh | None = None):
        if config.max_len is None:
            raise ValueError("Engine needs config.max_len (see EngineConfig.sized_for)")
        self.config = config
        self.max_len: int = config.max_len
        self.model_config = model.config
        self.vocab_size = model.config.vocab_size
        self.mesh = mesh
        self.dtype = model.dtype
        self.buckets = config.buckets()
        self.cache_lengths = config.cache_lengths()
        self.graphdef, params = split_params(model)
        shardings = param_shardings(model.config, mesh, ROLLOUT_RULES)
        self.abstract_params = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, self.dtype, sharding=s), params, shardings)
        self._slot_axes = self._slot_mesh_axes()
        # A DecodeState whose leaves are shardings (typed as arrays there).
        self._state_sharding: Any = self._decode_state_sharding()
        self._placers: dict[jax.sharding.Sharding, Any] = {}  # `place`'s, one a target
        self._prefill = jax.jit(self._prefill_fn, in_shardings=(shardings, None, None))
        # Sampled tokens and log-probs replicated: the host reads them, and on a pod no
        # process holds every slot.
        host = None if mesh is None else NamedSharding(mesh, PartitionSpec())
        # An insert is two programs: the first token's sampling, compiled once, and the
        # prefix's placement, compiled per (prefill bucket, cache length) pair but tiny.
        self._first_token = jax.jit(self._first_token_fn, out_shardings=(host, host))
        self._insert = jax.jit(self._insert_fn, donate_argnums=(1,),
                               out_shardings=self._state_sharding)
        # The decode step with the dense read, and (compiled when first used) the ragged one.
        self._ragged = self._ragged_reader()
        self._generate, self._generate_ragged = (
            jax.jit(functools.partial(self._generate_fn, read_cache=read), donate_argnums=(1,),
                    in_shardings=(shardings, None),
                    out_shardings=(self._state_sharding, host, host))
            for read in (None, self._ragged))
        self._resize_layer = jax.jit(_resized, static_argnums=(1, 2),
                                     out_shardings=self._state_sharding.cache.v[0])

    # ---- DecodeEngine ---------------------------------------------------------------------

    def check_params(self, params: Params) -> None:
        """Raises ValueError unless `params` has the model's tree and shapes, holds device
        arrays, and none of them was donated away (a learner's update takes the parameters it
        is given: use its current ones). Any dtype and layout: `place` makes the engine's."""
        # (jax's stubs type no comparison of tree structures)
        if jax.tree.structure(params) != jax.tree.structure(  # type: ignore[operator]
                self.abstract_params):
            raise ValueError("engine: the parameters' tree differs from the model's")
        for (path, given), want in zip(jax.tree.leaves_with_path(params),
                                       jax.tree.leaves(self.abstract_params)):
            if not isinstance(given, jax.Array):
                raise ValueError(f"engine: parameter {jax.tree_util.keystr(path)} is a "
                                 f"{type(given).__name__}, not a device array (it would be "
                                 "copied to the devices at every call)")
            if given.is_deleted():
                raise ValueError(f"engine: parameter {jax.tree_util.keystr(path)} was deleted "
                                 "(donated to an update since it was read): pass the "
                                 "learner's current parameters")
            if given.shape != want.shape:
                raise ValueError(f"engine: parameter {jax.tree_util.keystr(path)} is "
                                 f"{list(given.shape)}, the model's is {list(want.shape)}")

    def place(self, params: Params) -> Params:
        """See `DecodeEngine.place`: each weight cast where its shards live and resharded from
        there (for the learner's layout: gathered over fsdp) by a program of its own, so the
        devices hold the given parameters, the copy and one weight's temporaries at most.
        Checked first (`check_params`)."""
        self.check_params(params)
        if all(given.dtype == want.dtype
               and given.sharding.is_equivalent_to(want.sharding, given.ndim)
               for given, want in zip(jax.tree.leaves(params),
                                      jax.tree.leaves(self.abstract_params))):
            return params
        return jax.tree.map(lambda given, want: self._placer(want.sharding)(given), params,
                            self.abstract_params)

    def init_decode_state(self, length: int | None = None) -> DecodeState:
        """All slots empty (their rows are computed but ignored until something is inserted),
        with a cache of `length` entries (one of `cache_lengths`; None: the shortest)."""
        slots, length = self.config.slots, length or self.cache_lengths[0]
        state = DecodeState(
            cache=KVCache.zeros(self.model_config, slots, length, self.dtype),
            tokens=jnp.zeros(slots, jnp.int32), positions=jnp.zeros(slots, jnp.int32),
            steps=jnp.zeros(slots, jnp.int32), keys=jnp.zeros((slots, 2), jnp.uint32),
            temperature=jnp.zeros(slots, jnp.float32), top_p=jnp.ones(slots, jnp.float32),
            top_k=jnp.zeros(slots, jnp.int32), wants_top=jnp.zeros(slots, jnp.bool_))
        # Committed to its sharding, like every later state, so the first insert does not
        # compile a variant of its own.
        return jax.device_put(state, self._state_sharding)

    def prefill(self, params: Params, prompts: Sequence[Sequence[int]]) -> list[Prefix]:
        """Prefills 1 to `prefill_rows` prompts in one call, all at the bucket of the longest
        (rows padded to a compiled row count, and split over the slots' mesh axes where the
        count divides by them); returns one single-row Prefix per prompt, each held whole by
        every data x fsdp group (so an insert into any slot reads it where the slot lives)."""
        if not 1 <= len(prompts) <= self.config.prefill_rows:
            raise ValueError(f"prefill takes 1 to {self.config.prefill_rows} prompts, "
                             f"got {len(prompts)}")
        bucket = self.prefill_bucket(max(len(p) for p in prompts))
        rows = next(r for r in self.config.row_counts() if r >= len(prompts))
        ids = np.zeros((rows, bucket), np.int32)
        lengths = np.ones(rows, np.int32)  # padding rows: one token, never read
        for row, prompt in enumerate(prompts):
            ids[row, :len(prompt)] = prompt
            lengths[row] = len(prompt)
        prefixes = self._prefill(params, self._rows(ids), self._rows(lengths))
        return prefixes[:len(prompts)]

    def insert(self, prefix: Prefix, state: DecodeState, slot: int, sampling: SamplingParams,
               sample_index: int = 0) -> tuple[DecodeState, jax.Array, jax.Array]:
        """See `DecodeEngine.insert`; `sampling.seed` is required (the scheduler draws one for
        requests without). `state` is donated (its cache first grown to hold the prefix)."""
        if sampling.seed is None:
            raise ValueError("Engine.insert needs sampling.seed")
        state = self._fit(state, prefix.keys[0].shape[1], shrink=False)
        key = request_key(sampling.seed, sample_index)
        temperature, top_p = jnp.float32(sampling.temperature), jnp.float32(sampling.top_p)
        top_k = jnp.int32(sampling.top_k)
        token, logprob = self._first_token(prefix.last_logits, key, temperature, top_p, top_k)
        state = self._insert(prefix, state, jnp.int32(slot), token, key, temperature, top_p,
                             top_k, jnp.bool_(sampling.top_logprobs))
        return state, token, logprob

    def generate(self, params: Params, state: DecodeState, length: int,
                 filled: int | None = None) -> tuple[DecodeState, jax.Array, jax.Array]:
        """One token for every slot: (state, tokens [S] int32, logprobs [S] float32); `state`
        is donated. length, filled: see `DecodeEngine.generate`; the step runs on the shortest
        cache length that holds `length` (the cache resized first if it is shorter, or at
        least twice as long), reading each slot only to its own position where the busy
        slots fill under RAGGED_BELOW of the cache together (one long slot beside short ones)
        and the platform has a ragged read, else every slot's whole cache."""
        if not 1 <= length <= self.max_len:
            raise ValueError(f"generate: length {length} is outside 1..{self.max_len}")
        state = self._fit(state, length, shrink=True)
        sparse = (filled is not None and self._ragged is not None
                  and filled < RAGGED_BELOW * self.config.slots * state.cache.length)
        return (self._generate_ragged if sparse else self._generate)(params, state)

    def compiled(self, source: Params | None = None) -> dict[str, jax.stages.Compiled]:
        """The decode step (with each read the engine has) and the prefill of each bucket (at
           `prefill_rows` prompts),
        compiled from shapes on this engine's shardings, and with `source` (parameters'
        shapes, dtypes and shardings, e.g. the learner's) `place`'s program for its largest
        weight, for their `memory_analysis()` and `cost_analysis()` (nothing is run or
        allocated: the model's parameters may be ShapeDtypeStructs; benchmarks/aot.py)."""
        state = self._abstract_state()
        out = {"decode step": self._generate.lower(self.abstract_params, state).compile()}
        if self._ragged is not None:
            out["decode step, ragged read"] = self._generate_ragged.lower(
                self.abstract_params, state).compile()
        if source is not None:
            given, want = max(zip(jax.tree.leaves(source), jax.tree.leaves(self.abstract_params)),
                              key=lambda pair: math.prod(pair[0].shape))
            out["place (largest weight)"] = self._placer(want.sharding).lower(given).compile()
        rows = self.config.prefill_rows
        for bucket in self.buckets:
            out[f"prefill {rows} x {bucket}"] = self._prefill.lower(
                self.abstract_params, *(jax.ShapeDtypeStruct(
                    shape, jnp.int32, sharding=self._rows_sharding(shape))
                    for shape in ((rows, bucket), (rows,)))).compile()
        return out

    def device_bytes(self) -> int:
        """Bytes one device holds of the parameters and the decode state (nearly all of it
        the KV cache), from their shapes and shardings: nothing is allocated (engine.sizing
        checks it against the devices' memory before the first allocation), at the longest
        cache, plus the one layer a resize holds twice."""
        state = self._abstract_state()
        layer = (state.cache.k[0], state.cache.v[0])
        return sum(math.prod(a.sharding.shard_shape(a.shape)) * a.dtype.itemsize
                   for a in jax.tree.leaves((self.abstract_params, state, layer)))

    def step_bytes(self) -> int:
        """Bytes of temporaries one device's decode step takes beside the decode state: the
        logits and the sampler's arrays over them, SAMPLING_ARRAYS float32 [slots, vocabulary]
        arrays for the slots the device decodes (engine.sizing adds them to
        `device_bytes`)."""
        tokens = self._abstract_state().tokens
        slots = tokens.sharding.shard_shape(tokens.shape)[0]
        return SAMPLING_ARRAYS * 4 * slots * self.model_config.vocab_size

    # ---- helpers --------------------------------------------------------------------------

    def prefill_bucket(self, length: int) -> int:
        """The bucket a prompt of `length` tokens is padded to."""
        for bucket in self.buckets:
            if length <= bucket:
                return bucket
        raise ValueError(f"prompt of {length} tokens exceeds the largest bucket "
                         f"{self.buckets[-1]}")

    def warm_up(self, params: Params, prompt_lengths: Sequence[int] | None = None) -> None:
        """Compiles the prefill (at every row count) and insert of the buckets that prompts of
        `prompt_lengths` tokens use (default: every bucket), and the decode step (both reads,
        where the engine has two) at the cache lengths those prompts start in (longer ones
        compile when a slot first needs them)."""
        params = self.place(params)
        buckets = (self.buckets if prompt_lengths is None
                   else sorted({self.prefill_bucket(n) for n in prompt_lengths}))
        state = self.init_decode_state()
        for bucket in buckets:
            # A token short of the bucket (where that is still the bucket): its first step then
            # runs on the cache length that holds the bucket, where a prompt of it starts.
            n = min(bucket, self.max_len - 1)
            if n > 1 and self.prefill_bucket(n - 1) == bucket:
                n -= 1
            prompt = [0] * n
            for rows in self.config.row_counts():
                prefix = self.prefill(params, [prompt] * rows)[0]
            state, _, _ = self.insert(prefix, state, 0, SamplingParams(temperature=0.0, seed=0))
            if self._ragged is not None:  # the same step reading each slot to its length
                state, tokens, _ = self.generate(params, state, len(prompt) + 1, filled=1)
            state, tokens, _ = self.generate(params, state, len(prompt) + 1)
        jax.block_until_ready(tokens)

    def _fit(self, state: DecodeState, need: int, shrink: bool) -> DecodeState:
        """`state` with a cache of the shortest of `cache_lengths` that holds `need` entries,
        if its own is shorter or (shrink) at least twice that long."""
        target = next(n for n in self.cache_lengths if n >= need)
        current = state.cache.length
        if target > current or (shrink and 2 * target <= current):
            state = state._replace(cache=self._resize(state.cache, target))
        return state

    def _resize(self, cache: KVCache, length: int) -> KVCache:
        """The cache cut or zero-padded to `length` entries, a layer at a time: each old
        buffer is deleted as soon as its copy is made, so a resize holds one extra layer."""
        def each(buffers, axis):
            out = []
            for buffer in buffers:
                out.append(self._resize_layer(buffer, length, axis))
                buffer.delete()
            return tuple(out)
        return KVCache(each(cache.k, 3), each(cache.v, 2))

    def _abstract_state(self) -> DecodeState:
        """The decode state's shapes and shardings at the longest cache."""
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            jax.eval_shape(functools.partial(self.init_decode_state,
                                                              self.max_len)),
                            self._state_sharding)

    def _placer(self, sharding: jax.sharding.Sharding):
        """A weight cast to the compute dtype onto `sharding` (compiled per shape)."""
        if sharding not in self._placers:
            self._placers[sharding] = jax.jit(lambda x: x.astype(self.dtype),
                                              out_shardings=sharding)
        return self._placers[sharding]

    def _ragged_reader(self) -> ReadCacheFn | None:
        """The decode step's cache read of each slot to its own position: the platform's
        `RAGGED_READS` on each device's own slots and heads; None where it has none."""
        devices = [jax.devices()[0]] if self.mesh is None else self.mesh.devices.flat
        read = RAGGED_READS.get(next(iter(devices)).platform)
        if read is None:
            return None
        if self.mesh is None:
            return read
        slots, heads = self._state_sharding.cache.k[0].spec[:2]
        cache, query = PartitionSpec(slots, heads), PartitionSpec(slots, None, heads)
        return jax.shard_map(read, mesh=self.mesh,
                             in_specs=(query, cache, cache, PartitionSpec(slots)),
                             out_specs=query, check_vma=False)  # per device, no collective

    def _slot_mesh_axes(self) -> tuple[str, ...]:
        """The mesh axes slots split over: ROLLOUT_RULES' batch axes, and tensor where it
        cannot split the KV heads (attention data-parallel)."""
        axes = SLOT_AXES
        tensor = 1 if self.mesh is None else self.mesh.shape.get("tensor", 1)
        return axes + ("tensor",) if self.model_config.num_kv_heads % tensor else axes

    def _rows_sharding(self, shape: tuple[int, ...]) -> jax.sharding.Sharding:
        """Prefill inputs [R, ...]: rows over the slots' mesh axes (those that divide R)."""
        if self.mesh is None:
            return jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return NamedSharding(self.mesh, partition_spec(
            shape, ("batch",) + (None,) * (len(shape) - 1), self.mesh,
            {"batch": self._slot_axes}))

    def _rows(self, host: np.ndarray) -> jax.Array:
        """A host array [R, ...], the same in every process, on `_rows_sharding` (each process
        places the rows its devices hold)."""
        return jax.make_array_from_callback(host.shape, self._rows_sharding(host.shape),
                                            lambda index: host[index])

    def _decode_state_sharding(self) -> DecodeState:
        # Shardings where the fields' types say arrays: jit's out_shardings take a tree of the
        # state's structure (hence the ignores).
        layers = self.model_config.num_layers
        if self.mesh is None:
            device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
            return DecodeState(
                cache=KVCache((device,) * layers, (device,) * layers),  # type: ignore[arg-type]
                **dict.fromkeys(DecodeState._fields[1:], device))  # type: ignore[arg-type]
        c, slots, length = self.model_config, self.config.slots, self.max_len
        spec = functools.partial(partition_spec, mesh=self.mesh,
                                 rules={**ROLLOUT_RULES, "batch": self._slot_axes})
        # Keys and values differ only in the order of their last two, unsplit, dimensions.
        cache = NamedSharding(self.mesh, spec((slots, c.num_kv_heads, length, c.head_dim),
                                              ("batch", "kv_heads", None, None)))
        row = NamedSharding(self.mesh, spec((slots,), ("batch",)))
        keys = NamedSharding(self.mesh, spec((slots, 2), ("batch", None)))
        per_slot = dict.fromkeys(DecodeState._fields[1:], row)  # [S] each, but the keys
        return DecodeState(
            cache=KVCache((cache,) * layers, (cache,) * layers),  # type: ignore[arg-type]
            **{**per_slot, "keys": keys})  # type: ignore[arg-type]

    # ---- pure functions (jitted in __init__) -----------------------------------------------

    def _prefill_fn(self, params, ids, lengths) -> list[Prefix]:
        """ids [R, bucket] right-padded, lengths [R] -> R single-row prefixes. Split here, so
        that insert sees one prefix shape per bucket whatever the row count."""
        model = nnx.merge(self.graphdef, params)
        logits, keys, values = model.prefill(ids, logits_index=lengths - 1)
        whole = self._whole_row
        return [Prefix(tuple(whole(k[r:r + 1]) for k in keys),
                       tuple(whole(v[r:r + 1]) for v in values),
                       logits[r:r + 1], lengths[r]) for r in range(ids.shape[0])]

    def _whole_row(self, x: jnp.ndarray) -> jnp.ndarray:
        """A prefix's keys or values [1, T, Hkv, K], held whole by every slot group (KV heads
        split as the cache splits them), so one compiled insert serves every row."""
        if self.mesh is None:
            return x
        sharding = self._state_sharding.cache.v[0]
        return jax.lax.with_sharding_constraint(
            x, NamedSharding(self.mesh, PartitionSpec(None, None, sharding.spec[1])))

    def _first_token_fn(self, last_logits, key, temperature, top_p, top_k):
        """A prefix's first token and its logprob (scalars) from its last_logits [1, V]."""
        token, logprob = sample(last_logits, temperature[None], top_p[None], top_k[None],
                                key[None], jnp.zeros(1, jnp.int32))
        return token[0], jax.tree.map(lambda a: a[0], self._with_top(logprob, last_logits,
                                                                    temperature[None]))

    def _insert_fn(self, prefix: Prefix, state: DecodeState, slot, token, key, temperature,
                   top_p, top_k, wants_top):
        return DecodeState(
            cache=state.cache.write_prefix(prefix.keys, prefix.values, slot),
            tokens=state.tokens.at[slot].set(token),
            positions=state.positions.at[slot].set(prefix.length),
            steps=state.steps.at[slot].set(1),
            keys=state.keys.at[slot].set(key),
            temperature=state.temperature.at[slot].set(temperature),
            top_p=state.top_p.at[slot].set(top_p),
            top_k=state.top_k.at[slot].set(top_k),
            wants_top=state.wants_top.at[slot].set(wants_top))

    def _generate_fn(self, params, state: DecodeState, read_cache: ReadCacheFn | None):
        model = nnx.merge(self.graphdef, params)
        # A free slot keeps stepping; clamping keeps its writes inside the cache (a busy slot's
        # position is below the cache length: `generate`'s length). The next position is kept
        # unclamped by this cache's length: the next step's cache may be longer.
        logits, cache = model.decode_step(
            state.tokens, jnp.minimum(state.positions, state.cache.length - 1), state.cache,
            read_cache)
        tokens, logprobs = sample(logits, state.temperature, state.top_p, state.top_k,
                                  state.keys, state.steps)
        positions = jnp.minimum(state.positions + 1, self.max_len - 1)
        state = state._replace(cache=cache, tokens=tokens, positions=positions,
                               steps=state.steps + 1)
        return state, tokens, self._with_top(logprobs, logits, state.temperature,
                                             jnp.any(state.wants_top))

    def _with_top(self, logprobs, logits, temperature, wanted=None):
        """logprobs [S], or a StepLogprobs with the top tokens when config.top_logprobs asks:
        computed where `wanted` (a bool scalar; None: always), zeros elsewhere. (An insert
        computes its one row's always: that costs a step's top-k of one slot.)"""
        k = self.config.top_logprobs
        if not k:
            return logprobs

        def compute():
            return top_logprobs(logits, temperature, k)

        def skip():
            shape = (logits.shape[0], k)
            return jnp.zeros(shape, jnp.int32), jnp.zeros(shape, jnp.float32)

        top = compute() if wanted is None else jax.lax.cond(wanted, compute, skip)
        return StepLogprobs(logprobs, *top)


def _resized(buffer: jnp.ndarray, length: int, axis: int) -> jnp.ndarray:
    """buffer cut, or zero-padded at its end, to `length` entries along `axis`."""
    have = buffer.shape[axis]
    if length <= have:
        return jax.lax.slice_in_dim(buffer, 0, length, axis=axis)
    return jnp.pad(buffer, [(0, length - have if a == axis else 0) for a in range(buffer.ndim)])
