"""Reward functions in verl's `compute_score` signature, named by module path in tests
(`reward.function: tests.rl.example_reward[:name]`); each runs in the reward pool."""

import time


def compute_score(data_source, solution_str, ground_truth, extra_info):
    """1 when a ground truth appears in the solution (verl's layout: one string or a list)."""
    truths = [ground_truth] if isinstance(ground_truth, str) else ground_truth
    return float(any(t in solution_str for t in truths))


def as_dict(data_source, solution_str, ground_truth, extra_info):
    """verl's dict form: {"score": ..., other metrics}."""
    return {"score": compute_score(data_source, solution_str, ground_truth, extra_info),
            "length": len(solution_str)}


def raises_on_row_2(data_source, solution_str, ground_truth, extra_info):
    if extra_info.get("index") == 2:
        raise ZeroDivisionError("division by zero")
    return 0.5


HANG_S = 5.0  # well past the tests' reward.timeout_s of 1 s; a test that waits it out fails


def hangs(data_source, solution_str, ground_truth, extra_info):
    time.sleep(HANG_S)
    return 1.0


def says_yes(data_source, solution_str, ground_truth, extra_info):
    return "yes"


def row_says(data_source, solution_str, ground_truth, extra_info):
    """Whatever the row's extra_info holds under "score" (a reward's possible return values)."""
    return extra_info["score"]


def truth_as_stored(data_source, solution_str, ground_truth, extra_info):
    """1 where ground_truth is the row's `reward_model.ground_truth` as it was written (kept
    in extra_info["stored"]): a string stays a string, a number a number."""
    stored = extra_info["stored"]
    return float(type(ground_truth) is type(stored) and ground_truth == stored)
