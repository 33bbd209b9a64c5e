"""The lookup experiment: a tool-calling agent (agents/tool_calling.py) trained from an outcome
reward alone to answer with a tool it must call right (docs/tools.md). Above the core, which
reaches it by name only (configs name its tool and plugin)."""
