"""Fixtures shared by the test folders: one local Ray cluster for the whole test run (started on
first use; the parallel-runner and LM-server tests share it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    """A local two-CPU Ray cluster whose workers import this checkout and the test doubles."""
    ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'cb-agent[ray]')")
    here = Path(__file__).parent
    paths = [str(here / "agents"), str(here / "lm"), str(here.parent)]
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + ([old] if old else []))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


@pytest.fixture()
def site(tmp_path, monkeypatch, request):
    """A fresh site folder on the path for fake installed plug-ins
    (:func:`entry_point_doubles.install_entry_point`), the test's own folder too (where the
    example plug-in modules live)."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(request.path.parent))
    monkeypatch.syspath_prepend(str(site))
    return site
