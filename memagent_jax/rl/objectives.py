"""What the learner minimises, one object per kind of step, built once from `learner.loss`.

- `PolicyObjective` (`loss: dapo`): DAPO's clipped policy loss (`dapo.policy_loss`) on sampled
  rows with their group advantages; old log-probabilities recomputed or the rollout's, a KL
  reference where `kl_coef` != 0;
- `SupervisedObjective` (`loss: sft`): the supervised negative log-likelihood of given replies
  (`supervised.sft_loss`, advantage 1); no old log-probabilities, no reference, entropy a
  metric only.

The learner (rl/learner.py) asks its objective what the update needs and calls its `loss`; the
trainer's step (rl/steps.py) asks it whether the step samples (`supervised`).
"""

from __future__ import annotations

import jax

from memagent_jax.rl.config import LearnerConfig
from memagent_jax.rl.dapo import per_token, policy_loss, rollout_mismatch
from memagent_jax.rl.supervised import sft_loss

# The mismatch metrics measured inside the loss when old log-probabilities are the rollout's.
MISMATCH_METRICS = ("rollout_logprob_abs_diff", "rollout_kl_k3", "rollout_outside_clip")


class PolicyObjective:
    """DAPO's clipped policy loss (module docstring)."""
    supervised = False

    def __init__(self, config: LearnerConfig):
        self.config = config
        # Old log-probabilities: recomputed before the first update, or the rollout's; without
        # a recompute, the first mini-batch's forward is the one pass of the learner over the
        # sampled tokens under the parameters that sampled them: the mismatch is measured there.
        self.recompute_old = config.old_logprobs == "recompute"
        self.mismatch_in_loss = not self.recompute_old
        self.reference = config.kl_coef != 0.0
        self.entropy_in_loss = config.entropy_coef != 0.0

    def loss(self, logp, batch: dict, entropy):
        """logp, entropy [S, L] -> (the loss to differentiate, its metrics)."""
        config = self.config
        loss, metrics = policy_loss(
            logp, batch["old_logprobs"], batch["advantages"], batch["loss_mask"],
            eps_low=config.eps_low, eps_high=config.eps_high, dual_clip=config.dual_clip,
            ref_logp=batch.get("ref_logprobs"), kl_coef=config.kl_coef, entropy=entropy,
            entropy_coef=config.entropy_coef, row_weights=batch["row_weights"],
            token_weights=batch.get("is_weights"))
        if self.mismatch_in_loss:
            weights = batch["loss_mask"] * per_token(batch["row_weights"])
            metrics.update(rollout_mismatch(jax.lax.stop_gradient(logp), batch["old_logprobs"],
                                            weights, config.eps_low, config.eps_high))
        return loss, metrics


class SupervisedObjective:
    """The supervised negative log-likelihood (module docstring)."""
    supervised = True
    recompute_old = mismatch_in_loss = reference = entropy_in_loss = False

    def __init__(self, config: LearnerConfig):
        self.config = config

    def loss(self, logp, batch: dict, entropy):
        return sft_loss(logp, batch["loss_mask"], batch["row_weights"], entropy)


OBJECTIVES: dict[str, type[PolicyObjective] | type[SupervisedObjective]] = {
    "dapo": PolicyObjective, "sft": SupervisedObjective}


def objective(config: LearnerConfig) -> PolicyObjective | SupervisedObjective:
    """The objective `config.loss` names."""
    return OBJECTIVES[config.loss](config)
