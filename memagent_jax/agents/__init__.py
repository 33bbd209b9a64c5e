"""The shipped agents, each a module an `agent` section names (rollout/agent_api.py):
`memagent` (the default: read a document chunk by chunk into a memory, answer from it),
`single_turn` (a prompt, one reply: plain DAPO/GRPO) and `tool_calling` (Qwen's `<tool_call>`
format, tools as plain Python functions)."""
