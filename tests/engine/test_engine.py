"""The decoding engine and scheduler against transformers' generate, and their invariants."""

import numpy as np
import pytest
import torch

from memagent_jax.engine.engine import Engine
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Request, Scheduler, complete
from memagent_jax.errors import UserError
from memagent_jax.models.loading import load_model
from memagent_jax.models.qwen import split_params

pytestmark = pytest.mark.slow  # engines compiled and run against transformers

EOS = 2
GREEDY = SamplingParams(temperature=0.0, seed=0)


@pytest.fixture(scope="module")
def engine(model, params):
    engine = Engine(model, EngineConfig(slots=4, max_len=256))
    engine.warm_up(params)
    return engine


class _Counted:
    """An engine's prefill, counting the prompts it is given."""

    def __init__(self, engine):
        self.prompts, self._prefill = 0, engine.prefill

    def __call__(self, params, prompts):
        self.prompts += len(prompts)
        return self._prefill(params, prompts)


def _prompts(count, low=1, high=200, seed=0):
    rng = np.random.RandomState(seed)
    lengths = np.linspace(low, high, count).astype(int)
    return [tuple(int(t) for t in rng.randint(3, 101, n)) for n in lengths]


def _hf_greedy(reference, prompt, max_new_tokens):
    out = reference.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=EOS, pad_token_id=0,
                             output_scores=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt):].tolist()
    logprobs = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.scores, tokens)]
    return tokens, logprobs


def _complete_without_compiling(compilations, engine, params, requests):
    """complete(engine, params, requests), failing if anything compiles meanwhile."""
    with compilations() as counter:
        results = complete(engine, params, requests)
    assert counter.count == 0, f"{counter.count} compilations after warm-up"
    return results


def _greedy_requests(prompts):
    return [Request(p, max_new_tokens=10 + 3 * (i % 4), sampling=GREEDY, stop_ids=(EOS,))
            for i, p in enumerate(prompts)]


def test_greedy_matches_transformers_in_one_continuous_batch(engine, params, reference,
                                                             compilations):
    """16 prompts of lengths 1..200 through 4 slots, one run: every completion and logprob
    equals transformers' greedy generate on that prompt alone; nothing compiles after warm-up."""
    requests = _greedy_requests(_prompts(16))
    results = _complete_without_compiling(compilations, engine, params, requests)
    for request, (completion,) in zip(requests, results):
        tokens, logprobs = _hf_greedy(reference, request.prompt_ids, request.max_new_tokens)
        assert completion.token_ids == tokens
        assert np.abs(np.array(completion.logprobs) - np.array(logprobs)).max() <= 1e-4
        assert completion.finish_reason == ("stop" if tokens[-1] == EOS else "length")


def _reads(engine, monkeypatch) -> list[tuple[int, str]]:
    """Records each decode step the engine runs: (the longest busy slot's entries, "ragged"
    or "dense": the read the step took)."""
    reads, generate = [], engine.generate

    def recorded(params, state, length, filled=None):
        reads.append((length, None))
        return generate(params, state, length, filled)

    def counted(step, read):
        def run(*args):
            reads[-1] = (reads[-1][0], read)
            return step(*args)
        return run

    monkeypatch.setattr(engine, "generate", recorded)
    for name, read in (("_generate", "dense"), ("_generate_ragged", "ragged")):
        monkeypatch.setattr(engine, name, counted(getattr(engine, name), read))
    return reads


def test_one_long_slot_beside_short_ones_is_read_to_each_slots_length(engine, params, reference,
                                                                       compilations,
                                                                       monkeypatch):
    """A 200-token prompt beside three of 2 to 5 tokens fill under a quarter of the 256-entry
    cache together, so the CPU engine's steps read each slot only to its own position (XLA
    loops, `attend_cache_ragged`) while the long slot runs: greedy tokens and log-probs equal
    transformers', and warm-up compiled that step too."""
    reads = _reads(engine, monkeypatch)
    requests = _greedy_requests([_prompts(1, 200, 200, seed=7)[0]] + _prompts(3, 2, 5, seed=8))
    results = _complete_without_compiling(compilations, engine, params, requests)
    beside_the_long_slot = [read for length, read in reads if length > 200]
    assert len(beside_the_long_slot) >= 8 and set(beside_the_long_slot) == {"ragged"}, reads
    for request, (completion,) in zip(requests, results):
        tokens, logprobs = _hf_greedy(reference, request.prompt_ids, request.max_new_tokens)
        assert completion.token_ids == tokens
        assert np.abs(np.array(completion.logprobs) - np.array(logprobs)).max() <= 1e-4


def test_slots_that_fill_the_cache_are_read_whole(engine, params, monkeypatch):
    """Four prompts of 150 to 200 tokens, each given 8 new tokens, fill most of the 4 x
    256-entry cache at every step: each takes the dense read, which costs less there than
    reading each slot to its length."""
    reads = _reads(engine, monkeypatch)
    complete(engine, params, [Request(p, max_new_tokens=8, sampling=GREEDY)
                              for p in _prompts(4, 150, 200, seed=9)])
    assert reads and {read for _, read in reads} == {"dense"}, reads


def test_sampled_logprobs_are_at_the_requests_temperature(engine, params, reference):
    """Two requests at different temperatures share the batch; each token's logprob equals
    log_softmax(logits / T) of transformers' forward over the sampled sequence."""
    prompts = _prompts(2, 5, 30, seed=1)
    temps = [0.7, 1.6]
    requests = [Request(p, max_new_tokens=12, sampling=SamplingParams(t, seed=i))
                for i, (p, t) in enumerate(zip(prompts, temps))]
    for request, (completion,) in zip(requests, complete(engine, params, requests)):
        sequence = torch.tensor([request.prompt_ids + tuple(completion.token_ids)])
        with torch.no_grad():
            logits = reference(sequence).logits[0].float()
        start = len(request.prompt_ids) - 1
        expected = torch.log_softmax(logits / request.sampling.temperature, -1)
        expected = [expected[start + i, t].item() for i, t in enumerate(completion.token_ids)]
        assert np.abs(np.array(completion.logprobs) - np.array(expected)).max() <= 1e-4


def test_the_cache_follows_the_longest_slot_and_changes_no_token(model, params, reference,
                                                                 monkeypatch):
    """max_len 2048 on 2 slots: one request grows from 1500 to 1900 entries while short ones
    pass through the other slot, then short ones alone. The cache takes the lengths the
    longest busy slot needs (1536 up to 2048, then back to 1024 once it has finished) and every
    greedy token and log-probability equals transformers' forward over the sequence."""
    engine = Engine(model, EngineConfig(slots=2, max_len=2048))
    assert engine.cache_lengths == (1024, 1280, 1536, 1792, 2048)
    # A config that lists its prefill buckets lists the cache lengths (from 1024) with them.
    assert EngineConfig(max_len=2048, prefill_buckets=(128, 1536)).cache_lengths() == (1536,
                                                                                       2048)
    lengths = []
    step = engine.generate

    def generate(params, state, length, filled=None):
        state, tokens, logprobs = step(params, state, length, filled)
        if not lengths or lengths[-1] != state.cache.length:
            lengths.append(state.cache.length)
        return state, tokens, logprobs

    monkeypatch.setattr(engine, "generate", generate)
    long, short = _prompts(1, 1500, 1500, seed=7)[0], _prompts(6, 17, 32, seed=8)
    requests = ([Request(long, max_new_tokens=400, sampling=GREEDY)] +
                [Request(p, max_new_tokens=80, sampling=GREEDY) for p in short])
    results = complete(engine, params, requests)
    assert lengths == [1536, 1792, 2048, 1024]
    for request, (completion,) in zip(requests, results):
        sequence = torch.tensor([request.prompt_ids + tuple(completion.token_ids)])
        with torch.no_grad():
            logits = torch.log_softmax(reference(sequence).logits[0].float(), -1)
        start = len(request.prompt_ids) - 1
        expected = logits[start:start + len(completion.token_ids)]
        assert completion.token_ids == expected.argmax(-1).tolist()
        chosen = expected[torch.arange(len(expected)), completion.token_ids].numpy()
        assert np.abs(np.array(completion.logprobs) - chosen).max() <= 1e-4


def test_seed_gives_same_tokens_whatever_the_slot_and_order(engine, params):
    prompts = _prompts(6, 3, 60, seed=2)
    sampling = [SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=100 + i)
                for i in range(6)]
    requests = [Request(p, max_new_tokens=8, sampling=s) for p, s in zip(prompts, sampling)]
    forward = [r[0].token_ids for r in complete(engine, params, requests)]
    backward = [r[0].token_ids for r in complete(engine, params, requests[::-1])][::-1]
    alone = complete(engine, params, [requests[3]])[0][0].token_ids
    assert forward == backward and alone == forward[3]
    assert len({tuple(t) for t in forward}) > 1


def test_slots_take_the_next_request_without_idle_steps(engine, params, monkeypatch):
    """Outputs are read one step late: a request at its token limit leaves its slot the step
    its last token is asked for (8 requests of 5 tokens on 4 slots: 8 steps, as unpipelined);
    one that stops at a stop id is seen a step late, its slot's extra token discarded."""
    steps = []
    step = engine.generate
    monkeypatch.setattr(engine, "generate",
                        lambda p, state, length, filled=None: steps.append(1) or step(
                            p, state, length, filled))
    prompts = _prompts(8, 5, 40, seed=5)
    results = complete(engine, params,
                       [Request(p, max_new_tokens=5, sampling=GREEDY) for p in prompts])
    assert len(steps) == 8 and all(len(c.token_ids) == 5 for (c,) in results)

    greedy = results[0][0].token_ids
    stop = next(t for i, t in enumerate(greedy) if i >= 2 and t not in greedy[:i])
    steps.clear()
    (stopped,), = complete(engine, params, [Request(prompts[0], 5, GREEDY, stop_ids=(stop,))])
    assert stopped.token_ids == greedy[:greedy.index(stop) + 1]
    assert stopped.finish_reason == "stop" and len(steps) == len(stopped.token_ids)


def test_truncation_to_one_token_is_greedy(engine, params):
    prompt = _prompts(1, 20, 20, seed=3)[0]
    greedy = complete(engine, params, [Request(prompt, 10, GREEDY)])[0][0].token_ids
    for sampling in (SamplingParams(1.0, top_k=1, seed=5), SamplingParams(1.0, top_p=1e-6, seed=6)):
        assert complete(engine, params, [Request(prompt, 10, sampling)])[0][0].token_ids == greedy


def test_batched_prefill_gives_the_same_completions_in_fewer_calls(model, params, engine,
                                                                   compilations):
    """prefill_rows 4: the 16 prompts of the parity test (lengths 1..200, so a call mixes
    buckets) are prefilled 4 per call into 4 slots; every completion equals the one-prompt-per-
    call engine's (itself checked against transformers above), and after warm-up (every bucket
    at 1, 2 and 4 rows) nothing compiles."""
    batched = Engine(model, EngineConfig(slots=4, max_len=256, prefill_rows=4))
    batched.warm_up(params)
    calls = []
    prefill = batched._prefill
    batched._prefill = lambda params, ids, lengths: calls.append(ids.shape) or prefill(
        params, ids, lengths)
    batched.prefill = counted = _Counted(batched)
    requests = _greedy_requests(_prompts(16))
    results = _complete_without_compiling(compilations, batched, params, requests)
    assert counted.prompts == 16 and len(calls) < 16
    assert max(rows for rows, _ in calls) == 4
    for (got,), (want,) in zip(results, complete(engine, params, requests)):
        assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)


def test_group_sampling_prefills_once(engine, params, monkeypatch):
    prompt = _prompts(1, 40, 40, seed=4)[0]
    request = Request(prompt, max_new_tokens=6, sampling=SamplingParams(1.0, seed=9), n=5)
    counted = _Counted(engine)
    monkeypatch.setattr(engine, "prefill", counted)
    (samples,) = complete(engine, params, [request])
    assert counted.prompts == 1
    assert len(samples) == 5 and len({tuple(s.token_ids) for s in samples}) > 1
    # Sample 0 of a group is the request's n = 1 draw.
    single = complete(engine, params, [Request(prompt, 6, SamplingParams(1.0, seed=9))])[0][0]
    assert single.token_ids == samples[0].token_ids


def test_fused_attention_path_matches_reference(model_dir, engine, params):
    model, _ = load_model(model_dir, attention="dot_product")
    fused = Engine(model, EngineConfig(slots=4, max_len=256))
    requests = [Request(p, 8, GREEDY) for p in _prompts(5, 1, 120, seed=5)]
    for a, b in zip(complete(fused, split_params(model)[1], requests),
                    complete(engine, params, requests)):
        assert a[0].token_ids == b[0].token_ids
        assert np.abs(np.array(a[0].logprobs) - np.array(b[0].logprobs)).max() <= 1e-4


def test_prefill_calls_take_whole_rows_ahead_of_free_slots(model, params, monkeypatch):
    """20 requests of 1 to 12 tokens on 8 slots, prefill_rows 4: slots free one or two at a
    time, and each call prefills 4 prompts, those waiting next ahead of their slots; no slot
    waits for a call to fill (every step after the first fill decodes 8 slots while requests
    wait)."""
    engine = Engine(model, EngineConfig(slots=8, max_len=64, prefill_rows=4))
    calls, prefill = [], engine.prefill

    def counted(params, prompts):
        calls.append(len(prompts))
        return prefill(params, prompts)

    monkeypatch.setattr(engine, "prefill", counted)
    rng = np.random.RandomState(4)
    requests = [Request(p, int(rng.randint(1, 13)), GREEDY) for p in _prompts(20, 2, 40, seed=5)]
    scheduler, idle, generate = Scheduler(engine), [], engine.generate

    def step(params, state, length, filled=None):
        if scheduler._waiting:  # slots left free while requests wait
            idle.append(scheduler._slots.count(None))
        return generate(params, state, length, filled)

    monkeypatch.setattr(engine, "generate", step)
    for request in requests:
        scheduler.submit(request)
    scheduler.run(params)
    assert calls == [4] * 5, calls
    assert idle and set(idle) == {0}


def test_default_buckets_pad_long_prompts_by_at_most_a_quarter():
    buckets = EngineConfig(max_len=9000).buckets()
    assert buckets[0] == 16 and buckets[-1] == 9000 and list(buckets) == sorted(set(buckets))
    for length in range(1, 9001):
        bucket = next(b for b in buckets if b >= length)
        assert bucket <= (max(16, 2 * length - 1) if length <= 1024 else 1.25 * length)


def test_warm_up_for_given_prompt_lengths_compiles_their_buckets(model, params, compilations):
    """warm_up([5, 20]) compiles buckets 16 and 32 only: prompts of those buckets then run
    without compiling, and nothing was compiled for bucket 64."""
    engine = Engine(model, EngineConfig(slots=2, max_len=64, prefill_rows=2))
    engine.warm_up(params, [5, 20])
    _complete_without_compiling(compilations, engine, params,
                                _greedy_requests(_prompts(4, 1, 30, seed=3)))
    with compilations() as counter:
        complete(engine, params, _greedy_requests([tuple(range(3, 43))]))  # 40 tokens: bucket 64
    assert counter.count > 0



def test_a_slot_forgets_what_its_previous_occupant_left(engine, params, reference):
    """A prompt with an id past the embedding rows fills its slot's cache with NaN (the
    engine is given it directly: the scheduler refuses such ids); the next prompt inserted
    into that slot, shorter than the poisoned stretch, is answered as transformers answers it
    alone."""
    poisoned = engine.prefill(params, [(5,) * 40 + (engine.vocab_size + 7,)])[0]
    state = engine.init_decode_state()
    state, _, _ = engine.insert(poisoned, state, 0, GREEDY)
    for step in range(3):
        state, _, _ = engine.generate(params, state, 42 + step)
    assert np.isnan(np.asarray(state.cache.v[0][0])).any()
    prompt = (4, 9, 17)
    state, token, logprob = engine.insert(engine.prefill(params, [prompt])[0], state, 0, GREEDY)
    tokens, logprobs = [int(token)], [float(logprob)]
    for step in range(5):
        state, token, logprob = engine.generate(params, state, len(prompt) + 1 + step)
        tokens.append(int(token[0]))
        logprobs.append(float(logprob[0]))
    expected, expected_logprobs = _hf_greedy(reference, list(prompt), 6)
    assert tokens[:len(expected)] == expected
    assert np.abs(np.array(logprobs[:len(expected)]) - expected_logprobs).max() <= 1e-4


def test_the_scheduler_refuses_ids_outside_the_vocabulary(engine, params):
    for bad in (engine.vocab_size, -1):
        with pytest.raises(UserError, match=f"token id {bad} is outside the model's vocabulary"):
            complete(engine, params, [Request((3, bad, 4), max_new_tokens=2, sampling=GREEDY)])
