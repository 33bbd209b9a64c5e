"""Carry starts (synthetic/carry_starts.py): rollouts that begin inside a long document with the
question's facts in the memory, over the filler chunks the current model finds hardest to keep
it through; checked against the synthetic documents' own facts and the original's verifier, and
run through the agent."""

import numpy as np

from memagent_jax.models.qwen import split_params
from memagent_jax.rl.rewards import strict_reward
from memagent_jax.rollout.sampling import SamplingParams
from memagent_jax.rollout.templates import TokenPrompts
from memagent_jax.synthetic import tasks as synthetic
from memagent_jax.synthetic.carry_starts import carry_starts
from memagent_jax.tokenizer import word_ids

FACT_WORDS = ("code", "city")


def test_carry_starts_hold_the_facts_and_read_the_chunks_least_likely_kept(agent):
    tokenizer, end, seen = agent.tokenizer, agent.tokenizer.eos_token_id, []

    def logprobs(rows):  # a chunk's weakness: minus the number of times "the" occurs in it
        seen.append(len(rows))
        out = np.zeros(rows.tokens.shape, np.float32)
        the = word_ids(tokenizer, ["the"])[0]
        for i, (start, stop) in enumerate(zip(rows.prompt_lengths, rows.lengths)):
            # the reply is the memory unchanged and the end-of-text token
            assert rows.tokens[i, stop - 1] == end
            out[i, start] = -float(np.sum(rows.tokens[i, :start] == the))
        return out

    examples, samples = carry_starts(agent, 3, chunks=2, pool=4, seed=7, logprobs=logprobs)
    assert seen == [8, 8, 8]  # 2 x 4 candidates scored for each start
    assert [e.index for e in examples] == [-1, -2, -3] and {e.context for e in examples} == {""}
    tasks = set()
    for example, sample in zip(examples, samples):
        (answer,) = example.ground_truths
        tasks.add(example.data_source)
        assert sample.problem == example.question
        assert sample.problem_ids == tuple(tokenizer(example.question,
                                                     add_special_tokens=False)["input_ids"])
        memory = tokenizer.decode(list(sample.initial_memory))
        # the memory holds the answer's facts: the oracle's final reply from it is right
        assert answer in memory.replace(".", " . ").split()
        assert strict_reward(f"{memory} \\boxed{{{answer}}}", [answer]) == 1.0
        assert len(sample.chunks) == 2 and {len(c) for c in sample.chunks} == {64}
        for chunk in sample.chunks:  # filler: no fact sentence
            words = tokenizer.decode(list(chunk)).split()
            assert not any(w == "the" and words[i + 1] in FACT_WORDS and words[i + 2] == "of"
                           for i, w in enumerate(words[:-2]))
    assert tasks <= {"synthetic_multikey", "synthetic_twohop"}
    # the chosen chunks are the two with the most "the" of each start's eight candidates
    first = samples[0]
    again_examples, again = carry_starts(agent, 3, chunks=2, pool=4, seed=7, logprobs=logprobs)
    assert again == samples and again_examples == examples
    counts = [sum(t == word_ids(tokenizer, ["the"])[0] for t in chunk)
              for chunk in first.chunks]
    candidates = [tokenizer(synthetic.filler_text(64, 7, k), add_special_tokens=False)
                  ["input_ids"] for k in range(8)]
    all_counts = sorted((sum(t == word_ids(tokenizer, ["the"])[0] for t in c)
                         for c in candidates), reverse=True)
    assert sorted(counts, reverse=True) == all_counts[:2]
    assert all(tuple(c) in {tuple(x) for x in candidates} for c in first.chunks)
    other, _ = carry_starts(agent, 3, chunks=2, pool=4, seed=8, logprobs=logprobs)
    assert [e.question for e in other] != [e.question for e in examples]


def test_a_carry_start_runs_through_the_agent_from_its_memory(agent, sft_model):
    def logprobs(rows):
        return np.zeros(rows.tokens.shape, np.float32)

    _, samples = carry_starts(agent, 2, chunks=3, pool=1, seed=1, logprobs=logprobs)
    prompts = TokenPrompts(agent.tokenizer)
    groups = agent.run(split_params(sft_model)[1], samples, SamplingParams(1.0, seed=0), n=2)
    for sample, group in zip(samples, groups):
        for trajectory in group:
            assert [t.kind for t in trajectory.turns] == ["update"] * 3 + ["final"]
            assert trajectory.turns[0].prompt_ids == prompts.update(
                sample.problem_ids, sample.initial_memory, sample.chunks[0])
