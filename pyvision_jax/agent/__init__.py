"""The agent: prompts, action parsing, the sandboxed Python runtime, episodes and tasks."""
