"""An agent that reads where it runs: its prompt holds the process's index, so on two
processes their engine calls differ (tests/e2e/test_multiprocess.py: the run stops, naming it)."""

import jax


async def rollout(row, policy):
    messages = [{"role": "user", "content": row.question + " ?" * jax.process_index()}]
    reply = await policy.chat(messages, max_tokens=4)
    return [messages + [reply.message]]
