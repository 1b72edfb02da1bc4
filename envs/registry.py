"""Environment registry: ``make_env("alfworld")`` -> a fresh adapter (engines imported on demand)."""

from __future__ import annotations

import importlib

from envs.protocol import Environment

#: name -> "module:class"; the module is imported only when that environment is made.
ENVIRONMENTS: dict[str, str] = {
    "alfworld": "envs.alfworld:AlfworldEnv",
    "scienceworld": "envs.scienceworld:ScienceWorldEnv",
    "textworld": "envs.textworld:TextWorldEnv",
}


def make_env(name: str, **kwargs) -> Environment:
    """Create the adapter registered as ``name`` with ``kwargs`` passed to its constructor.

    Raises:
        ValueError: unknown ``name`` (the message lists the known ones).
    """
    target = ENVIRONMENTS.get(name)
    if target is None:
        raise ValueError(f"unknown environment {name!r}; known: {sorted(ENVIRONMENTS)}")
    module_name, attr = target.split(":")
    return getattr(importlib.import_module(module_name), attr)(**kwargs)
