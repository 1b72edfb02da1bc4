"""Shared fixtures for the environment tests: one isolated cache dir, set for each of their modules."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def isolated_cache_dir(tmp_path_factory):
    """A fresh folder for the environment tests' cache (generated games, ALFWorld's traj_data)."""
    return tmp_path_factory.mktemp("cb-agent-cache")


@pytest.fixture(scope="module", autouse=True)
def isolated_cache(isolated_cache_dir):
    """``CB_AGENT_CACHE`` points at :func:`isolated_cache_dir` while an environment test module runs,
    so these tests never read or write the user's cache; it is restored after each module, so the
    setting does not leak into the test folders collected after this one."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CB_AGENT_CACHE", str(isolated_cache_dir))
        yield isolated_cache_dir
