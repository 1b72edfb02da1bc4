"""Shared fixtures for the environment tests: an isolated cache dir for the whole session."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory):
    """Point ``CB_AGENT_CACHE`` at a fresh folder so tests never read or write the user's cache."""
    old = os.environ.get("CB_AGENT_CACHE")
    path = tmp_path_factory.mktemp("cb-agent-cache")
    os.environ["CB_AGENT_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("CB_AGENT_CACHE", None)
    else:
        os.environ["CB_AGENT_CACHE"] = old
