"""Agents shipped beside MemAgent (rollout/memagent.py), each a module an `agent` section names
(rollout/agent_api.py): `single_turn` (a prompt, one reply: plain DAPO/GRPO) and
`tool_calling` (Qwen's `<tool_call>` format, tools as plain Python functions)."""
