"""Environment registry: ``make_env("alfworld")`` -> a fresh adapter (engines imported on demand), and
each environment's evaluation split (:func:`default_split`)."""

from __future__ import annotations

import importlib

from envs.protocol import Environment

#: name -> "module:class"; the module is imported only when that environment is made.
ENVIRONMENTS: dict[str, str] = {
    "alfworld": "envs.alfworld:AlfworldEnv",
    "scienceworld": "envs.scienceworld:ScienceWorldEnv",
    "textworld": "envs.textworld:TextWorldEnv",
}
#: name -> the split an evaluation plays by default (the held-out games of each benchmark).
EVAL_SPLITS: dict[str, str] = {"alfworld": "valid_unseen", "scienceworld": "test", "textworld": "test"}


def default_split(name: str) -> str:
    """The evaluation split of environment ``name`` (:data:`EVAL_SPLITS`; ``"test"`` for another)."""
    return EVAL_SPLITS.get(name, "test")


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
