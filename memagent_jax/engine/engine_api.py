"""The engine's contract, apart from its kernels: its config, the types it hands the
scheduler, the `DecodeEngine` protocol (JetStream's `engine_api`), and `PromptTooLong`, the
error a call whose prompt leaves no room for a reply raises (in the agent that made it:
rollout/agent_api.py names it too). Loading a train, eval or
serve config imports this, never the Pallas kernels `engine/engine.py` compiles.

`DecodeEngine` is the interface the scheduler drives: `prefill(params, prompts)` runs up to
`prefill_rows` prompts at a bucketed length into prefixes (their KV caches and last logits);
`insert(prefix, state, slot, ...)` puts one into a free slot of the decode state, sampling its
first token; `generate(params, state, length)` advances every slot by one token. Parameters are
passed into every call that runs the model: an engine holds none, so a learner's update (which
donates its old buffers) can never leave a stale copy behind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

from memagent_jax.errors import ConfigError, UserError
from memagent_jax.runconfig import at_least

if TYPE_CHECKING:  # JAX loads with an engine, not with a config that holds this one's
    import jax.numpy as jnp

    from memagent_jax.engine.sampling import SamplingParams
    from memagent_jax.models.qwen import KVCache


class PromptTooLong(UserError):
    """A prompt that leaves no room for a reply within the engine's max_len."""


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """The `engine` section of the train and eval configs (and the flags of `generate`/`run`).
    With top_logprobs k > 0 a step computes the alternatives (a top-k over the vocabulary,
    `StepLogprobs`) only when some slot's request asked (`SamplingParams.top_logprobs`), else
    returns zeros."""
    SECTION: ClassVar[str] = "engine"
    slots: int = 8              # sequences decoded together
    max_len: int | None = None  # KV entries per slot, prompt + reply (None: `kv_length` of need)
    prefill_buckets: tuple[int, ...] | None = None  # prompt lengths compiled (max_len always;
                                                    # from 1024 on also the cache's lengths)
    prefill_rows: int = 1       # most prompts per prefill call (compiled for 1, 2, 4, ...)
    top_logprobs: int = 0       # alternatives per token returned (OpenAI's top_logprobs)

    def __post_init__(self):
        at_least(self, 1, "slots", "prefill_rows")
        at_least(self, 0, "top_logprobs")
        at_least(self, 2, "max_len")
        if self.prefill_buckets is not None:
            if not self.prefill_buckets or min(self.prefill_buckets) < 1:
                raise ConfigError("engine.prefill_buckets", f"must be positive lengths, got "
                                  f"{list(self.prefill_buckets)}")
            if self.max_len is not None and max(self.prefill_buckets) > self.max_len:
                raise ConfigError("engine.prefill_buckets", f"{max(self.prefill_buckets)} "
                                  f"exceeds the KV length {self.max_len}")

    def sized_for(self, tokens: int) -> EngineConfig:
        """This config with max_len `kv_length(tokens)` when it leaves max_len to the caller."""
        if self.max_len is not None:
            return self
        return dataclasses.replace(self, max_len=kv_length(tokens))

    def cache_lengths(self) -> tuple[int, ...]:
        """The KV lengths a decode state takes, ascending: the prefill buckets from 1024 on (by
        default a cache of at most a quarter more than its longest slot needs; a config that
        lists its buckets lists the cache lengths it compiles with them), or max_len alone
        when it is at most 1024 (below that the cache costs little beside the weights)."""
        buckets = self.buckets()
        return tuple(b for b in buckets if b >= min(1024, buckets[-1]))

    def buckets(self) -> tuple[int, ...]:
        """The prompt lengths a prefill is padded to, ascending; the last is max_len (which a
        sized config has set)."""
        assert self.max_len is not None, "an unsized EngineConfig (see sized_for)"
        if self.prefill_buckets:
            return tuple(sorted(set(self.prefill_buckets) | {self.max_len}))
        return default_prefill_buckets(self.max_len)

    def row_counts(self) -> tuple[int, ...]:
        """Row counts a prefill call is padded to: powers of two below prefill_rows, and it."""
        counts, r = [], 1
        while r < self.prefill_rows:
            counts.append(r)
            r *= 2
        return tuple(counts) + (self.prefill_rows,)


def kv_length(tokens: int) -> int:
    """KV entries for `tokens`: the next power of two up to 256, then the next multiple of 256
    (the longest cache a slot may need, padded by under 256 entries)."""
    if tokens > 256:
        return -(-tokens // 256) * 256
    length = 16
    while length < tokens:
        length *= 2
    return length


def default_prefill_buckets(max_len: int) -> tuple[int, ...]:
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
    """A prefilled prompt: keys, values (per layer [1, bucket, Hkv, K]), last_logits [1, V],
    length [] int32."""
    keys: tuple[jnp.ndarray, ...]
    values: tuple[jnp.ndarray, ...]
    last_logits: jnp.ndarray
    length: jnp.ndarray


class StepLogprobs(NamedTuple):
    """What an engine with `config.top_logprobs` = k returns in place of plain log-probs:
    chosen [S] (the sampled tokens'), top_ids [S, k] int32 and top [S, k] float32 (each slot's
    k most likely tokens, most likely first, at its temperature; an insert's without the S)."""
    chosen: jnp.ndarray
    top_ids: jnp.ndarray
    top: jnp.ndarray


class DecodeState(NamedTuple):
    """Everything a decode step reads, one row per slot ([S] unless noted)."""
    cache: KVCache            # per layer: keys [S, Hkv, K, L], values [S, Hkv, L, K], L one
                              # of config.cache_lengths()
    tokens: jnp.ndarray       # int32: the token each slot feeds next
    positions: jnp.ndarray    # int32: that token's position
    steps: jnp.ndarray        # int32: tokens generated so far (indexes the sampling key)
    keys: jnp.ndarray         # [S, 2] uint32: the slot's request key
    temperature: jnp.ndarray  # float32
    top_p: jnp.ndarray        # float32
    top_k: jnp.ndarray        # int32
    wants_top: jnp.ndarray    # bool: the slot's request reads its top tokens (kept once the
                              # slot is free, until the next insert)


class DecodeEngine(Protocol):
    """What the scheduler needs of an engine. `params` is whatever the engine's model takes
    (for `Engine`, the model's `Params`); prefixes and the decode state are opaque to callers.
    Outputs may be device arrays, read later: tokens [S] int and logprobs [S] float of a
    `generate` hold one entry per slot, an `insert`'s are scalars; with config.top_logprobs
    > 0, logprobs is a `StepLogprobs`. Prompt ids are in [0, vocab_size): the scheduler refuses
    others before they reach the engine."""
    config: EngineConfig
    max_len: int  # config.max_len, which an engine needs set (`EngineConfig.sized_for`)
    vocab_size: int

    def check_params(self, params) -> None:
        """Raises ValueError unless `params` fits the engine's model and is still alive (the
        scheduler calls it before each run)."""

    def place(self, params) -> Any:
        """`params` as every other call takes them: a copy in the engine's layout and dtype,
        made on the devices, or `params` themselves where they already are."""

    def init_decode_state(self) -> Any:
        """A decode state with every slot empty."""

    def prefill(self, params, prompts: Sequence[Sequence[int]]) -> list[Any]:
        """One prefix per prompt; 1 to `config.prefill_rows` prompts of 1 to max_len - 1
        tokens."""

    def insert(self, prefix, state, slot: int, sampling: SamplingParams,
               sample_index: int = 0) -> tuple[Any, Any, Any]:
        """(state with the prefix in `slot`, its first token, that token's logprob); sampled
        with the key of sample `sample_index` of a request seeded `sampling.seed`. Nothing the
        slot's previous occupant left (its cache entries, NaN included) reaches the new one.
        `state` may be consumed: use the returned one."""

    def generate(self, params, state, length: int, filled: int | None = None
                 ) -> tuple[Any, Any, Any]:
        """(state, tokens [S], logprobs [S]): one token for every slot; `state` may be
        consumed. length: the most KV entries a busy slot holds after this step (its prompt
        and the tokens fed so far, this step's included; at most max_len): what the step must
        read. filled: the entries the busy slots hold together (None: every slot `length`),
        for an engine that can read each slot to its own length. Free slots get meaningless
        tokens."""
