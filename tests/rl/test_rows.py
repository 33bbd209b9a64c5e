"""Training rows (rl/rows.py): which turns are rows, and where their tokens, loss mask and
behaviour log-probs sit."""

import numpy as np
import pytest

from memagent_jax.rl.rows import rows_from_trajectories
from memagent_jax.rollout.agent_api import Trajectory, Turn


def test_a_turn_without_response_ids_is_no_row():
    """A server's reply (text, no ids) has nothing to train: the rows are the other turns,
    each indexed by its own place in the trajectory."""
    update = Turn("update", [1, 2], [5, 6, 2], [-0.5, -0.25, -0.125], "stop", "a")
    server = Turn("update", [], [], [], "stop", "b", server_tokens=3)
    final = Turn("final", [1, 3], [7, 2], [-0.75, -0.5], "stop", "c")
    rows = rows_from_trajectories([[Trajectory("", [update, server, final])]], [[2.0]])
    assert len(rows) == 2 and list(rows.turn) == [0, 2] and list(rows.final) == [False, True]
    np.testing.assert_array_equal(rows.tokens, [[1, 2, 5, 6, 2], [1, 3, 7, 2, 0]])
    np.testing.assert_array_equal(rows.loss_mask, [[0, 0, 1, 1, 1], [0, 0, 1, 1, 0]])
    np.testing.assert_array_equal(rows.rollout_logprobs, [[0, 0, -0.5, -0.25, -0.125],
                                                          [0, 0, -0.75, -0.5, 0]])
    with pytest.raises(ValueError, match="no turn with response tokens to train on"):
        rows_from_trajectories([Trajectory("", [server])], [1.0])
