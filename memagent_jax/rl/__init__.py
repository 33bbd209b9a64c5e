"""Reinforcement learning for the memory agent: verifiers, advantages, the DAPO loss, training
rows and the learner (and, beside them, the trainer loop)."""
