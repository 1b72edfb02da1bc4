"""Plug-in seams: third-party code registered under an entry-point group, loaded by name.

A package adds, in its ``pyproject.toml``::

    [project.entry-points."cb_agent.lm_backends"]
    my-backend = "my_package.lm:load"

and after ``pip install`` that name is selectable from the CLI (``--model my-backend:ARG``) with
no change to cb-agent. This module only finds and loads the registered objects; each seam's
registry (:mod:`agent_shell.lm.factory` for LM backends) says what the object must be.

Imports nothing of ours.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Iterable


def registered(group: str, reserved: Iterable[str] = ()) -> dict[str, EntryPoint]:
    """Entry points of ``group`` by name, without the ``reserved`` (built-in) names, which a
    plug-in cannot override. Two distributions registering one name: the first found wins."""
    reserved = set(reserved)
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=group):
        if ep.name not in reserved:
            found.setdefault(ep.name, ep)
    return found


def load_registered(group: str, name: str, reserved: Iterable[str] = (), what: str = "plug-in") -> object:
    """The object registered as ``name`` in ``group`` (what it must be is the seam's to check).

    Raises:
        ValueError: no such name (the message lists the registered ones and the group), or the
            entry point fails to import (naming it and the error).
    """
    plugins = registered(group, reserved)
    if name not in plugins:
        known = sorted(set(reserved) | set(plugins))
        raise ValueError(f"unknown {what} {name!r}; known: {known} (third-party ones register under the "
                         f"entry-point group {group!r})")
    try:
        return plugins[name].load()
    except Exception as err:  # an ImportError or any error raised while importing the plug-in
        raise ValueError(f"{what} {name!r} ({plugins[name].value}) failed to load: "
                         f"{type(err).__name__}: {err}") from err


__all__ = ["load_registered", "registered"]
