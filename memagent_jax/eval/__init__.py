"""Evaluation over context lengths: metrics, the eval runner, tables and plots."""
