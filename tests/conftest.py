"""Fixtures shared by the test folders: one local Ray cluster for the whole test run (started on
first use; the parallel-runner and LM-server tests share it), and headless Chromium with the
network cut off (the slow browser tests of the decision explorer and the docs site); the process's
executable store off for a test that changes a program without changing its source."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import settings

# Under pytest-xdist the workers already use every core (pyproject's addopts): one torch thread a
# worker, set before any test imports torch (more threads than cores slow every test several-fold).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Property tests draw the same examples on every run (derived from each test's source), so the
# suite's outcome never depends on a random draw; a test's own settings inherit this.
settings.register_profile("deterministic", derandomize=True)
settings.load_profile("deterministic")


@pytest.fixture(scope="session")
def host_fetches():
    """The benchmarks' diagnostic :func:`benchmarks._fetches.host_fetches` (the JAX arrays whose
    values reach the host inside a block), loaded from its file."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "_fetches.py"
    spec = importlib.util.spec_from_file_location("benchmark_fetches", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.host_fetches


@pytest.fixture()
def no_executable_store(monkeypatch):
    """The process's store of compiled programs (:func:`cb_core.cache.enable_persistent_cache`, which
    an earlier in-process command may have turned on) off for one test, and put back after: a test
    whose program changes while its source does not (a patched module, weights changed in place)
    traces afresh instead of running an executable stored under the same key."""
    from cb_core import cache

    for name, value in (("_EXECUTABLES", None), ("_WRITE", None), ("_LOADED", {}), ("_WARNED", set())):
        monkeypatch.setattr(cache, name, value, raising=False)


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


#: Chromium's flags for the browser tests: headless, and none of the browser's own background traffic
#: (component updates, sync, field trials), so that every request a page makes is the page's.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync")


def chromium() -> str:
    """The system Chromium's path (``CHROMIUM`` overrides), or skip saying why."""
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("no chromium binary (apt-get install chromium; .ci/install does)")
    return path


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium: Debian's binary, driven by Playwright (no browser download)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the browser extra: pip install -e '.[browser]'")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium(), args=list(CHROMIUM_FLAGS))
        yield b
        b.close()


@pytest.fixture()
def offline_page(browser):
    """A page with no network: every request other than a ``file:`` one (or one under a prefix passed
    to ``page.allow``, a local server's) is aborted and its URL kept in ``page.refused`` (a page that
    reads offline leaves it empty); uncaught script errors are kept in ``page.errors``."""
    context = browser.new_context()
    page = context.new_page()
    page.refused, page.errors, allowed = [], [], ["file:"]
    page.allow = allowed.append

    def route(r):
        if r.request.url.startswith(tuple(allowed)):
            r.continue_()
        else:
            page.refused.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page.on("pageerror", lambda err: page.errors.append(str(err)))
    yield page
    context.close()
