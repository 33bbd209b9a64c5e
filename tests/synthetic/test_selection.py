"""`memagent-jax trace --selection` (synthetic/selection.py): a memory checked for each fact of
its document, the asked ones apart from the distractors; the summary's rates and its exact
test of "an asked fact is held as any fact of its document". (A read through the CLI:
tests/synthetic/test_demo.py.)"""

import numpy as np

from memagent_jax.synthetic import tasks as synthetic
from memagent_jax.synthetic.selection import (
    DocumentSelection,
    document_selection,
    exchangeable_test,
    sentences,
    summarize,
)


def _selection(asked, distractors, answer="x", truth="x"):
    return DocumentSelection(0, "", list(asked), list(distractors), 0, 0, 0, 0.0, answer, truth)


def test_a_memory_is_checked_for_every_fact_of_its_document():
    document = synthetic.make_sample("multikey", 200, 1, 0)
    asked = next(f.text for f in document.facts if f.needed)
    other = [f.text for f in document.facts if not f.needed]
    # The decoder's spacing ("v."), a fact twice, a made-up value, a sentence cut at the end.
    memory = " ".join([asked[:-2] + ".", asked, other[1], "the code of zz yy .", "a b"])
    s = document_selection(3, document, memory, 12.5, document.answer)
    assert s.asked == [True] and s.distractors == [False, True, False]
    assert (s.sentences, s.fact_form, s.facts_stated) == (5, 4, 3)
    assert s.correct and s.index == 3 and s.update_tokens == 12.5


def test_sentences_split_at_full_stops_joined_or_not():
    assert sentences("the code of a b. the code of c d .\nx y") == [
        ["the", "code", "of", "a", "b"], ["the", "code", "of", "c", "d"], ["x", "y"]]
    assert sentences("") == [] and sentences(" . ") == []


def test_the_exact_test_by_hand():
    """One multikey memory holding only its asked fact: by chance 1 in 4 (p = 2 x 1/4); two
    such: 1/16; a memory holding nothing adds nothing; twohop (2 asked of 6), all held."""
    assert exchangeable_test([_selection([True], [False] * 3)]) == (0.25, 0.5)
    assert exchangeable_test([_selection([True], [False] * 3)] * 2) == (0.5, 0.125)
    assert exchangeable_test([_selection([True], [False] * 3),
                              _selection([False], [False] * 3)]) == (0.25, 0.5)
    assert exchangeable_test([_selection([True] * 2, [True] * 4)]) == (2.0, 1.0)
    expected, p = exchangeable_test([_selection([False], [True] * 3)] * 3)
    assert expected == 2.25 and p == 2 * 0.25 ** 3


def test_the_exact_test_holds_its_level_where_a_per_document_vote_does_not():
    """Facts held independently at 0.35 whatever they say (no selection): over 300 sets of 64
    multikey memories the test rejects at 5 % about 5 % of the time. A vote a document (asked
    fact held against the distractors' share held) leans the other way at that rate."""
    rng = np.random.default_rng(0)
    rejected, leaning = [], []
    for _ in range(300):
        held = rng.random((64, 4)) < 0.35
        selections = [_selection(row[:1], row[1:]) for row in held]
        rejected.append(exchangeable_test(selections)[1] < 0.05)
        share = held[:, 1:].mean(axis=1)
        leaning.append(np.sum(held[:, 0] > share) - np.sum(held[:, 0] < share))
    assert np.mean(rejected) < 0.08, np.mean(rejected)
    assert np.mean(leaning) < -3, np.mean(leaning)


def test_the_summary_counts_pairs_with_their_intervals():
    selections = [_selection([True], [False, False, True]), _selection([True], [False] * 3),
                  _selection([False], [False, True, False], answer="y")]
    lines = summarize(selections)
    assert lines[0] == "memories holding an asked fact: 2 of 3 (66.7 %, 95 % 20.8-93.9)"
    assert lines[1] == ("memories holding a distractor: 2 of 9 (22.2 %, 95 % 6.3-54.7), "
                        "3 a document")
    assert lines[2].startswith("asked facts held: 2, where a memory holding as many facts "
                               "would hold 1.0 of them by chance; exact p = ")
    assert lines[-1].endswith("answers right 2 of 3")
