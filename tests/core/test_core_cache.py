"""The compiled-program store (:mod:`cb_core.cache`): a one-off fit process loads the fit from it,
a damaged stored file is compiled again instead of crashing or changing the result, the store
removes the leftovers of killed writes, and a store that cannot keep files says so in one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import cb_core
from core_helpers import random_decisions, save_decisions

ROOT = Path(__file__).resolve().parents[2]

CORRUPT_AND_CALL = """
import sys
from pathlib import Path
import jax, jax.numpy as jnp, numpy as np
from cb_core import cache as store
from cb_io.storage import write_bytes_atomic

folder = Path(sys.argv[1])
store.enable_persistent_cache(folder, write_bytes_atomic)
def body(n, x):
    step = lambda c: (c[0] + 1, jnp.tanh(c[1] @ c[1].T @ c[1]) * 0.5 + c[1])
    return jax.lax.while_loop(lambda c: c[0] < n, step, (0, x))[1].sum(axis=0)
prog = jax.jit(body, static_argnums=0)
x = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
want = np.asarray(prog(5, x))  # the plain jit call
store.call_compiled("prog", prog, (5,), (x,), 0)
(path,) = (folder / "executables").iterdir()
good = path.read_bytes()
for k in range(1, 9):
    offset = len(good) * k // 9
    bad = bytearray(good)
    bad[offset] ^= 0xFF
    path.write_bytes(bytes(bad))
    store._LOADED.clear()  # what a new process sees
    out = np.asarray(store.call_compiled("prog", prog, (5,), (x,), 0))
    assert np.array_equal(out, want), offset
    assert store.unseal(path.read_bytes()) is not None, offset  # replaced by a whole file
print("ok", len(good))
"""


def _env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **extra)


def test_a_stored_executable_with_a_flipped_byte_is_compiled_again(tmp_path):
    """A byte flipped anywhere in a stored executable (eight offsets through the file) is never
    deserialized: the call compiles again, equals the plain jit call and stores a whole file. Run
    in a subprocess: loading such a file used to end the process (SIGSEGV, SIGILL) or give another
    result."""
    res = subprocess.run([sys.executable, "-c", CORRUPT_AND_CALL, str(tmp_path / "jax")], env=_env(),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and res.stdout.startswith("ok"), (res.returncode, res.stderr[-3000:])


ON_DEVICES = """
import sys
from pathlib import Path
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from cb_core import cache as store
from cb_io.storage import write_bytes_atomic

folder, mesh_size = Path(sys.argv[1]), int(sys.argv[2])
store.enable_persistent_cache(folder, write_bytes_atomic)
prog = jax.jit(lambda w, x: jnp.tanh(x @ w).sum(axis=1))
w = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
mesh = Mesh(np.asarray(jax.devices()[:mesh_size]), ("model",))
w = jax.device_put(w, NamedSharding(mesh, PartitionSpec(None, "model")))
compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, secs, **kw: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration" else None)
out = np.asarray(store.call_compiled("prog", prog, (), (w, x), 0))
assert np.allclose(out, np.tanh(np.asarray(x, np.float64) @ np.asarray(w, np.float64)).sum(axis=1), atol=1e-4)
print(len(compiles), len(list((folder / "executables").iterdir())))
"""


@pytest.mark.slow  # four subprocesses, two with simulated devices
def test_a_stored_executable_runs_on_the_devices_it_was_compiled_for(tmp_path):
    """A program laid out over one device and one over a mesh of two are stored apart, and each is
    loaded, not compiled again, by a new process with four devices: one device's program on that
    device, the mesh's on the mesh (``execution_devices``; by default JAX would bind a stored
    executable to every device of the process)."""
    def run(devices: int, mesh: int) -> tuple[int, int]:
        env = _env(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
        res = subprocess.run([sys.executable, "-c", ON_DEVICES, str(tmp_path / "jax"), str(mesh)], env=env,
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        compiled, files = map(int, res.stdout.split())
        return compiled, files

    assert run(1, 1)[1] == 1  # compiled and stored
    assert run(4, 1) == (0, 1)  # loaded onto the one device
    assert run(4, 2)[1] == 2  # the mesh's program is another one
    assert run(4, 2) == (0, 2)


def test_seal_detects_every_changed_byte():
    from cb_core.cache import seal, unseal

    blob = bytes(range(256)) * 3
    sealed = seal(blob)
    assert unseal(sealed) == blob and len(sealed) == len(blob) + 32
    for offset in range(0, len(sealed), 7):
        bad = bytearray(sealed)
        bad[offset] ^= 0x01
        assert unseal(bytes(bad)) is None, offset
    assert unseal(sealed[:-1]) is None and unseal(b"") is None and unseal(blob) is None


def _fit_cli(npz: Path, out: Path, cache: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent_shell.cli", "fit", str(npz), "--out", str(out)],
                          env=_env(CB_AGENT_CACHE=str(cache), **env), capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_cli_fit_after_its_stored_executable_was_corrupted_recompiles_to_the_same_alpha(tmp_path):
    """`cb-agent fit` whose stored fit executable has a byte flipped (several offsets, where the
    old store crashed with SIGILL or an XLA abort, or ran and changed the result) compiles again,
    exits 0 and saves the alpha of the first fit."""
    from cb_core.synthetic import synthetic_decisions

    save_decisions(tmp_path / "d.npz", synthetic_decisions(6, 8, seed=1))
    cache = tmp_path / "cache"
    first = _fit_cli(tmp_path / "d.npz", tmp_path / "c.safetensors", cache)
    assert first.returncode == 0, first.stderr[-2000:]
    want = cb_core.Concept.load(tmp_path / "c.safetensors").alpha
    (stored,) = (cache / "jax" / "executables").glob("fit-*.bin")
    good = stored.read_bytes()
    for fraction in (0.0, 0.25, 0.66, 0.71, 0.76, 0.84, 0.999):
        offset = int(len(good) * fraction)
        bad = bytearray(good)
        bad[offset] ^= 0xFF
        stored.write_bytes(bytes(bad))
        out = tmp_path / f"c{offset}.safetensors"
        res = _fit_cli(tmp_path / "d.npz", out, cache, JAX_LOG_COMPILES="1")
        assert res.returncode == 0 and "converged=True" in res.stdout, (offset, res.returncode, res.stderr[-2000:])
        assert "_solve" in res.stderr  # compiled again, not loaded
        np.testing.assert_array_equal(cb_core.Concept.load(out).alpha, want)
def test_cli_process_uses_the_stored_executable_and_imports_no_backbone(tmp_path):
    """A second one-off `cb-agent fit` process loads the fit's compiled executable from the
    cache (JAX compiles nothing: the log of compiles is empty of the fit) and gives the same
    concept; the command imports neither torch, transformers nor a game engine."""
    dec = random_decisions(5, [4, 6, 3], 5)
    save_decisions(tmp_path / "d.npz", dec)
    env = _env(CB_AGENT_CACHE=str(tmp_path / "cache"), JAX_LOG_COMPILES="1")
    script = ("import sys; from agent_shell.cli import main\n"
              "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
              "print('modules', sorted({m.split('.')[0] for m in sys.modules}))")
    outs = []
    for k in range(2):
        cmd = [sys.executable, "-c", script, "fit", str(tmp_path / "d.npz"), "--out",
               str(tmp_path / f"c{k}.safetensors")]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0 and "converged=True" in res.stdout, res.stderr
        outs.append(res)
    modules = outs[1].stdout.split("modules", 1)[1]
    for heavy in ("torch", "transformers", "alfworld", "textworld", "scienceworld"):
        assert f"'{heavy}'" not in modules
    assert "_solve" in outs[0].stderr  # the first process compiled the fit ...
    assert "_solve" not in outs[1].stderr  # ... the second loaded it
    assert len(list((tmp_path / "cache" / "jax" / "executables").iterdir())) >= 1
    a, b = (cb_core.Concept.load(tmp_path / f"c{k}.safetensors") for k in range(2))
    np.testing.assert_array_equal(a.alpha, b.alpha)


def test_an_executable_stored_after_a_jax_cache_hit_still_loads(tmp_path):
    """The store holds fresh compiles only. When the store lacks a fit that JAX's own persistent
    cache holds, the process that stores it must not serialize the executable JAX's cache handed
    back (on the CPU that one has no machine code: the next process that loaded it failed with
    ``NOT_FOUND: Function ... not found``, and compiled again). Three one-off fits: store, then
    JAX's cache alone, then the store again, which the third process loads without compiling;
    all three give the same concept."""
    dec = random_decisions(7, [4, 6, 3, 5], 6)
    save_decisions(tmp_path / "d.npz", dec)
    cache = tmp_path / "cache"
    alphas = []
    for k in range(3):
        if k == 1:  # JAX's cache keeps what the first process compiled; the store is lost
            shutil.rmtree(cache / "jax" / "executables")
        out = tmp_path / f"c{k}.safetensors"
        res = _fit_cli(tmp_path / "d.npz", out, cache, JAX_LOG_COMPILES="1")
        assert res.returncode == 0 and "converged=True" in res.stdout, (k, res.stderr[-2000:])
        assert ("_solve" in res.stderr) == (k < 2), k  # the third process compiled nothing
        alphas.append(cb_core.Concept.load(out).alpha)
    assert len(list((cache / "jax" / "executables").iterdir())) >= 1
    for alpha in alphas[1:]:
        np.testing.assert_array_equal(alpha, alphas[0])


def test_a_stored_executable_that_fails_to_run_is_compiled_again(tmp_path, monkeypatch):
    """A stored file that loads but fails when it runs (a broken or foreign executable; the
    failure shows only once the asynchronously dispatched result is waited for) costs a fresh
    compile, never the fit: the result equals the plain jit call's and the file is replaced."""
    import jax
    from jax.experimental import serialize_executable

    from cb_core import cache as store

    from cb_io.storage import write_bytes_atomic

    monkeypatch.setattr(store, "_EXECUTABLES", tmp_path / "executables")
    monkeypatch.setattr(store, "_WRITE", write_bytes_atomic)
    monkeypatch.setattr(store, "_LOADED", {})
    double = jax.jit(lambda scale, x: scale * x, static_argnums=0)
    x = np.arange(4.0, dtype=np.float32)
    store.call_compiled("double", double, (2.0,), (x,), 0)  # compiles and stores
    (path,) = (tmp_path / "executables").iterdir()
    before = path.read_bytes()

    class Pending:  # an asynchronously dispatched result whose program turns out broken
        def block_until_ready(self):
            raise RuntimeError("NOT_FOUND: Function multiply_fusion not found")

    def broken(*_args, **_kwargs):
        return lambda *_a: Pending()

    monkeypatch.setattr(serialize_executable, "deserialize_and_load", broken)
    monkeypatch.setattr(store, "_LOADED", {})  # a new process
    path.write_bytes(store.seal(b"not this program"))  # whole, so it is deserialized
    out = store.call_compiled("double", double, (2.0,), (x,), 0)
    np.testing.assert_array_equal(np.asarray(out), 2.0 * x)
    assert path.read_bytes() == before  # stored again, whole




@pytest.fixture()
def fresh_store(monkeypatch):
    """The store's process state as a new process has it, restored afterwards; JAX's own
    configuration left as it is (:func:`cb_core.cache.enable_persistent_cache` would set it)."""
    import jax

    from cb_core import cache as store

    for name, value in (("_EXECUTABLES", None), ("_WRITE", None), ("_LOADED", {}), ("_WARNED", set())):
        monkeypatch.setattr(store, name, value, raising=False)
    monkeypatch.setattr(jax.config, "update", lambda name, value: None)
    return store


def test_a_cache_folder_that_is_a_file_is_one_warning_and_no_store(tmp_path, fresh_store):
    """``<cache>/jax`` a file: one warning line naming it, not a FileExistsError; nothing is
    stored and the programs run."""
    from cb_io.storage import write_bytes_atomic

    (tmp_path / "jax").write_text("not a folder")
    with pytest.warns(UserWarning) as caught:
        assert fresh_store.enable_persistent_cache(tmp_path / "jax", write_bytes_atomic) is None
    (warning,) = caught
    assert str(tmp_path / "jax") in str(warning.message) and "\n" not in str(warning.message)
    assert fresh_store._EXECUTABLES is None  # nothing is stored, and the calls still run
    double = __import__("jax").jit(lambda x: 2 * x)
    np.testing.assert_array_equal(np.asarray(fresh_store.call_compiled("d", double, (), (np.ones(3),), 0)), 2.0)


def test_a_store_that_cannot_take_a_file_says_so_once(tmp_path, fresh_store):
    """``executables`` a file: one warning line (not one per program, not none), and every
    program still runs."""
    import jax

    from cb_io.storage import write_bytes_atomic

    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "executables").write_text("not a folder")
    x = np.arange(4.0, dtype=np.float32)
    with pytest.warns(UserWarning) as caught:
        fresh_store.enable_persistent_cache(tmp_path / "jax", write_bytes_atomic)
        for scale in (2.0, 3.0):
            program = jax.jit(lambda s, v: s * v, static_argnums=0)
            out = fresh_store.call_compiled(f"scale{scale}", program, (scale,), (x,), 0)
            np.testing.assert_array_equal(np.asarray(out), scale * x)
    assert len(caught) == 1 and str(tmp_path / "jax" / "executables") in str(caught[0].message)


def test_the_store_removes_the_leftovers_of_killed_writes(tmp_path, fresh_store):
    """Temporary files of writes killed part-way (older than LEFTOVER_AGE_S) go; a fresh one (a
    write in progress elsewhere) and the stored executables stay."""
    from cb_io.storage import write_bytes_atomic

    folder = tmp_path / "jax" / "executables"
    folder.mkdir(parents=True)
    old = time.time() - fresh_store.LEFTOVER_AGE_S - 60
    for name in ("tmpk1ll3d.tmp", "tmpa8c2.tmp", "lm-qwen2-stream-0123.bin"):
        (folder / name).write_bytes(b"x" * 10)
        os.utime(folder / name, (old, old))
    (folder / "tmpwr1t1ng.tmp").write_bytes(b"x")  # another process's write, now
    fresh_store.enable_persistent_cache(tmp_path / "jax", write_bytes_atomic)
    assert sorted(p.name for p in folder.iterdir()) == ["lm-qwen2-stream-0123.bin", "tmpwr1t1ng.tmp"]
