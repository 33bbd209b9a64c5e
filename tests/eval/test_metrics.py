"""Test metrics of docs/algorithm.md section 2: normalisation, EM, sub-EM, F1, string_match_all."""

import pytest

from memagent_jax.eval.metrics import (
    exact_match,
    f1,
    normalize_answer,
    qa_scores,
    string_match_all,
    sub_exact_match,
)


@pytest.mark.parametrize("text,expected", [
    ("The Eiffel Tower", "eiffel tower"),
    ("  an   apple,  a pear! ", "apple pear"),
    ("U.S.A.", "usa"),
    ("Theatre of the Absurd", "theatre of absurd"),  # "the" only as a word
    ("A-ha's \"Take On Me\"", "ahas take on me"),
    ("", ""),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_ignores_case_articles_punctuation():
    assert exact_match("the Beatles.", "Beatles") == 1.0
    assert exact_match("BEATLES", "beatles!") == 1.0
    assert exact_match("The Rolling Stones", "Beatles") == 0.0
    assert exact_match("Beatles band", "Beatles") == 0.0


def test_sub_exact_match_both_directions():
    assert sub_exact_match("It was the Beatles, in 1963", "Beatles") == 1.0  # gold in pred
    assert sub_exact_match("Paris", "Paris, France") == 1.0                  # pred in gold
    assert sub_exact_match("London", "Paris, France") == 0.0


def test_sub_exact_match_empty_prediction_is_not_contained_everywhere():
    assert sub_exact_match("The.", "Paris") == 0.0
    assert sub_exact_match("", "Paris") == 0.0
    assert sub_exact_match("", "the") == 1.0  # both empty after normalisation: equal


def test_f1_partial_overlap():
    # pred tokens: new york city; gold: new york -> p = 2/3, r = 1, f1 = 0.8
    assert f1("New York City", "New York") == pytest.approx(0.8)
    assert f1("the cat sat", "a dog ran") == 0.0
    assert f1("Barack Obama", "barack obama") == 1.0


def test_yes_no_must_match_exactly():
    assert f1("yes", "yes") == 1.0
    assert f1("yes", "no") == 0.0
    assert f1("yes", "yes it is") == 0.0       # closed answer on the prediction side
    assert f1("yes it is", "yes") == 0.0       # and on the gold side
    assert exact_match("Yes.", "yes") == 1.0
    assert sub_exact_match("no", "yes") == 0.0


def test_several_gold_answers_take_the_best():
    golds = ["Paris", "City of Light"]
    assert exact_match("city of light", golds) == 1.0
    assert sub_exact_match("the capital is Paris", golds) == 1.0
    assert f1("light city", golds) == pytest.approx(f1("light city", "City of Light"))
    assert f1("light city", golds) > f1("light city", ["Paris"])
    assert exact_match("Lyon", golds) == 0.0
    assert exact_match("x", []) == 0.0


def test_missing_prediction_scores_zero():
    assert qa_scores(None, "Paris") == {"em": 0.0, "sub_em": 0.0, "f1": 0.0}
    assert string_match_all(None, ["1234"]) == 0.0


def test_string_match_all_counts_references_case_insensitively():
    refs = ["8490321", "ALPHA-beta", "zzz"]
    assert string_match_all("numbers: 8490321 and alpha-BETA", refs) == pytest.approx(2 / 3)
    assert string_match_all("nothing", refs) == 0.0
    assert string_match_all("8490321 alpha-beta zzz", refs) == 1.0
    # no normalisation beyond case: punctuation inside a reference must be there
    assert string_match_all("alpha beta", ["alpha-beta"]) == 0.0
    assert string_match_all("abc", "ABC") == 1.0
