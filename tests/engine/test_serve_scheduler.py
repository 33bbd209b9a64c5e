"""What `serve` adds to the engine and scheduler: top log-probs from the engine (against
transformers' forward), cancellation that frees slots, submissions while running (poll), and
tokens seen as they are read (on_token)."""

import numpy as np
import pytest
import torch

from memagent_jax.engine.engine import Engine
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Request, Scheduler, complete

pytestmark = pytest.mark.slow  # the scheduler against transformers

GREEDY = SamplingParams(temperature=0.0, seed=0)


@pytest.fixture(scope="module")
def engine(model):
    return Engine(model, EngineConfig(slots=2, max_len=64, prefill_buckets=(16,),
                                      top_logprobs=5))


@pytest.mark.parametrize("temperature", [0.0, 1.3])
def test_top_logprobs_are_transformers_log_softmax_at_the_temperature(engine, params, reference,
                                                                      temperature):
    prompt = (5, 9, 17, 33, 60, 7)
    sampling = SamplingParams(temperature, seed=3, top_logprobs=True)
    (completion,) = complete(engine, params, [Request(prompt, 6, sampling)])[0]
    sequence = torch.tensor([prompt + tuple(completion.token_ids)])
    with torch.no_grad():
        logits = reference(sequence).logits[0].float()
    expected = torch.log_softmax(logits / (temperature or 1.0), -1)
    assert len(completion.top_logprobs) == 6
    for i, (token, logprob, (ids, values)) in enumerate(zip(
            completion.token_ids, completion.logprobs, completion.top_logprobs)):
        row = expected[len(prompt) - 1 + i]
        best = torch.topk(row, 5)
        assert list(ids) == best.indices.tolist()
        assert np.allclose(values, best.values.numpy(), atol=1e-4)
        assert abs(logprob - row[token].item()) <= 1e-4
        if temperature == 0:  # greedy picks the first alternative, with the same number
            assert token == ids[0] and logprob == pytest.approx(values[0], abs=1e-6)


def test_without_top_logprobs_completions_carry_none(model, params):
    plain = Engine(model, EngineConfig(slots=2, max_len=64, prefill_buckets=(16,)))
    (completion,) = complete(plain, params, [Request((5, 9), 3, GREEDY)])[0]
    assert completion.top_logprobs == [] and len(completion.logprobs) == 3


def test_steps_compute_top_tokens_only_while_a_slot_asks(engine, params, monkeypatch):
    """A request that asks shares the batch with one that does not: the first gets its top
    tokens, the second none; once only requests that do not ask are decoding (in slots whose
    last request did not ask either), steps return zeros instead of computing them."""
    asking = Request((5, 9, 17), 4, SamplingParams(0.0, seed=1, top_logprobs=True))
    quiet = Request((6, 10), 9, GREEDY)
    (wanted,), (plain,) = complete(engine, params, [asking, quiet])
    assert len(wanted.top_logprobs) == 4 and plain.top_logprobs == []
    assert [ids[0] for ids, _ in wanted.top_logprobs] == wanted.token_ids  # greedy: the best

    steps = []
    original = engine.generate

    def generate(p, state, length, filled=None):
        state, tokens, logprobs = original(p, state, length, filled)
        steps.append(np.asarray(logprobs.top_ids))
        return state, tokens, logprobs

    monkeypatch.setattr(engine, "generate", generate)
    scheduler = Scheduler(engine)
    scheduler.submit(Request((6, 10), 5, GREEDY, n=2))  # both slots, neither asks
    scheduler.run(params)
    assert steps and all(not ids.any() for ids in steps)
    steps.clear()
    scheduler.submit(Request((6, 10), 3, SamplingParams(0.0, seed=2, top_logprobs=True)))
    scheduler.run(params)
    assert any(ids.any() for ids in steps)


def test_cancel_frees_the_slots_and_drops_the_request(engine, params):
    """Two slots, a long request (n=2: both slots) and a short one waiting: cancelling the
    long one mid-way lets the short one start at once; the long one never finishes and its
    callbacks stop."""
    scheduler = Scheduler(engine)
    events, steps = [], [0]
    long_id = scheduler.submit(
        Request((5, 6, 7), 40, GREEDY, n=2),
        on_done=lambda c: events.append("long done"),
        on_token=lambda sample, token, logprob, top: events.append(("long", sample)))
    short_done = []
    scheduler.submit(Request((8, 9), 4, GREEDY), on_done=short_done.append)

    def poll():
        steps[0] += 1
        if steps[0] == 4:
            assert scheduler.busy_slots == 2  # the short request is still waiting
            scheduler.cancel(long_id)
            assert scheduler.busy_slots == 0
            events.append("cancelled")

    scheduler.run(params, poll=poll)
    after = events[events.index("cancelled"):]
    assert "long done" not in events and not any(isinstance(e, tuple) for e in after)
    assert len(short_done) == 1 and len(short_done[0][0].token_ids) == 4
    assert long_id not in scheduler.requests and long_id not in scheduler.results
    assert steps[0] < 12  # the short request ran right after the cancel, not after 40 steps
    scheduler.cancel(long_id)  # a finished or unknown id: nothing happens
    scheduler.cancel(12345)


def test_poll_submits_while_running_and_on_token_sees_every_token(engine, params):
    """Requests submitted from poll join the running batch; on_token sees each token in order
    before on_done, with the same numbers as the completion; results equal a plain run."""
    scheduler = Scheduler(engine)
    prompts = [(5, 6, 7), (10, 11), (20, 21, 22, 23)]
    requests = [Request(p, 5 + i, GREEDY) for i, p in enumerate(prompts)]
    seen = {i: [] for i in range(3)}
    done = {}
    pending = list(enumerate(requests))

    def submit(i, request):
        scheduler.submit(request, on_done=lambda c, i=i: done.setdefault(i, (c, list(seen[i]))),
                         on_token=lambda s, t, lp, top, i=i: seen[i].append((t, lp)))

    submit(*pending.pop(0))

    def poll():
        if pending and scheduler.busy_slots:  # later requests arrive while one decodes
            submit(*pending.pop(0))

    scheduler.run(params, poll=poll)
    expected = complete(engine, params, requests)
    for i in range(3):
        (completion,), tokens_before_done = done[i]
        assert completion.token_ids == expected[i][0].token_ids
        assert tokens_before_done == list(zip(completion.token_ids, completion.logprobs))
