"""agent_shell: prompting, routing, candidate construction, LM backends and agents.

May import :mod:`cb_core` and the :mod:`envs` protocol; nothing here is imported by them.
"""
