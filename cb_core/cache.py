"""Compiled programs kept on disk, in a directory the caller chooses (for one-off CLI fits).

cb_core decides no file locations and writes no files: the agent shell passes ``<its cache
dir>/jax`` and its atomic file writer to :func:`enable_persistent_cache`. That turns on two
stores in the directory:

* JAX's persistent compilation cache (every compiled program; still traces and lowers the
  program in each new process to find it), and
* ``executables/``: cb_core's fit programs as serialized executables, keyed by everything the
  program depends on (the solver, the argument shapes and dtypes, where the arguments lie: the
  devices by id and how each array is split over them, the jax / jaxlib versions, the backend and
  CPU, cb_core's own source), so an executable compiled for one device is never loaded for a call
  on eight. A new process loads and runs one without tracing,
  lowering or compiling (:func:`call_compiled`). What is stored is always a fresh compile, never
  an executable JAX's cache handed back: on the CPU that one re-serializes without its machine
  code, and a later process that loads it fails with ``NOT_FOUND: Function <fusion> not found``
  (jaxlib 0.10). Each file holds the SHA-256 digest of the serialized executable before it
  (:func:`seal` / :func:`unseal`); a file whose digest does not match (a flipped byte, a torn
  write) is never deserialized (a damaged executable can crash the process with SIGILL or an XLA
  abort, which no ``except`` catches): the program is compiled again and the file replaced.

Like JAX's own cache, the store is trusted code: loading an executable can run anything, so the
directory must be the user's own. Call :func:`enable_persistent_cache` from entry points, never
from library maths.

The store keeps its folder tidy and says when it cannot keep anything: a write killed part-way
leaves a temporary file beside the executables, which the next :func:`enable_persistent_cache`
removes once it is older than :data:`LEFTOVER_AGE_S` (no write of one executable takes that long,
so a live write of another process is never touched); a directory that cannot be a folder (a file
in its place) or a store that refuses a file is one warning line per process, and the programs are
then compiled in each process instead.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

__all__ = ["LEFTOVER_AGE_S", "enable_persistent_cache", "call_compiled", "seal", "unseal"]

#: Seconds after which a file in the store's folder that is no stored executable (a temporary file
#: of a write that was killed) is removed.
LEFTOVER_AGE_S = 3600.0

_EXECUTABLES: Path | None = None
_WRITE: Callable[[Path, bytes], None] | None = None  # the caller's atomic writer
_LOADED: dict[Path, Any] = {}  # executables loaded or compiled by this process, by file
_COMPILING = threading.Lock()  # one fresh compile at a time (it switches JAX's cache off)


def enable_persistent_cache(directory: str | os.PathLike,
                            write_file: Callable[[Path, bytes], None]) -> Path | None:
    """Turn on JAX's persistent compilation cache and cb_core's executable store in
    ``directory`` (created if needed), after removing the store's leftovers (temporary files of
    killed writes older than :data:`LEFTOVER_AGE_S`). Returns the directory, or None when it
    cannot be a folder (a file in its place, no permission): one warning line, and nothing is
    stored.

    Args:
        directory: the cache folder (the user's own: its executables are run).
        write_file: ``write_file(path, data)`` replaces ``path`` by a file holding ``data``
            atomically, creating its folder (the agent shell passes
            :func:`cb_io.storage.write_bytes_atomic`).
    """
    import jax

    global _EXECUTABLES, _WRITE
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        _cannot_store(directory, err)
        return None
    executables = directory / "executables"
    if executables.exists() and not executables.is_dir():
        _cannot_store(executables, FileExistsError(f"{executables} is a file, not a folder"))
    _remove_leftovers(executables)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    _EXECUTABLES, _WRITE = executables, write_file
    return directory


_WARNED: set[Path] = set()  # folders this process has said it cannot store in


def _cannot_store(folder: Path, err: BaseException) -> None:
    """One warning line per process and folder: compiled programs are not kept there."""
    if folder in _WARNED:
        return
    _WARNED.add(folder)
    reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
    if isinstance(err, (FileExistsError, NotADirectoryError)):
        reason = "a file stands where its folder should be"
    warnings.warn(f"compiled programs are not kept in {folder} ({reason}): each new process compiles them "
                  "again; remove or fix it to keep them", stacklevel=3)


def _remove_leftovers(folder: Path) -> None:
    """Remove the files in the store's folder that are no stored executable (``*.bin``) and older
    than :data:`LEFTOVER_AGE_S`: temporary files of writes that were killed part-way."""
    try:
        entries = list(os.scandir(folder))
    except OSError:  # no folder yet, or not a folder
        return
    now = time.time()
    for entry in entries:
        try:
            if (not entry.name.endswith(".bin") and entry.is_file(follow_symlinks=False)
                    and now - entry.stat(follow_symlinks=False).st_mtime > LEFTOVER_AGE_S):
                os.unlink(entry.path)
        except OSError:  # removed meanwhile by another process, or not ours to remove
            pass


_DIGEST = hashlib.sha256().digest_size  # bytes of the digest at the start of a stored file


def digest(blob: bytes) -> bytes:
    """The SHA-256 digest (32 bytes) that a stored file's content is checked against at load: a
    stored executable's (:func:`seal`) and a concept file's (:meth:`cb_core.Concept.load`)."""
    return hashlib.sha256(blob).digest()


def seal(blob: bytes) -> bytes:
    """A stored file's content: the SHA-256 digest of ``blob`` (32 bytes), then ``blob``."""
    return digest(blob) + blob


def unseal(data: bytes) -> bytes | None:
    """The blob a :func:`seal`-ed ``data`` holds, or None when its digest does not match (the file
    was changed, torn or written in another layout)."""
    blob = data[_DIGEST:]
    return blob if len(data) > _DIGEST and digest(blob) == data[:_DIGEST] else None


@functools.lru_cache(maxsize=1)
def _fingerprint() -> dict:
    """What a compiled executable depends on besides its program, arguments and x64 mode."""
    import jax
    import jaxlib

    device = jax.devices()[0]
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        import platform

        cpu = platform.processor()
    source = hashlib.sha256()
    here = Path(__file__).parent
    for path in sorted(here.glob("*.py")):
        source.update(path.read_bytes())
    return dict(jax=jax.__version__, jaxlib=jaxlib.__version__, platform=device.platform,
                platform_version=device.client.platform_version, device=device.device_kind,
                cpu=hashlib.sha256(cpu.encode()).hexdigest(), cb_core=source.hexdigest())


def _devices(x) -> list | None:
    """The devices a JAX array lies on (its mesh's, in the mesh's order), None for a host array."""
    sharding = getattr(x, "sharding", None)
    if sharding is None:
        return None
    mesh = getattr(sharding, "mesh", None)
    return list(mesh.devices.flat) if mesh is not None else sorted(sharding.device_set, key=lambda d: d.id)


def _placement(x) -> list | None:
    """Where an argument lies, for the key: None for a host array (numpy: the call puts it on the
    default device), else [its devices' platform and ids, its sharding's partition spec]."""
    devices = _devices(x)
    if devices is None:
        return None
    return [devices[0].platform, [d.id for d in devices], str(getattr(x.sharding, "spec", x.sharding))]


@contextlib.contextmanager
def _fresh_compilation():
    """Compile for real inside: JAX's persistent cache is off (and reset) for the duration.

    An executable that JAX's cache deserialized would serialize without its machine code on the
    CPU, so it must not reach the store. JAX decides once per process whether its cache is used,
    hence the reset on the way in and out (``compilation_cache.reset_cache``, public API).
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    with _COMPILING:
        enabled = jax.config.jax_enable_compilation_cache
        jax.config.update("jax_enable_compilation_cache", False)
        compilation_cache.reset_cache()
        try:
            yield
        finally:
            jax.config.update("jax_enable_compilation_cache", enabled)
            compilation_cache.reset_cache()


def call_compiled(name: str, jitted: Callable, static: tuple, args: tuple, out_example: object):
    """``jitted(*static, *args)``, from a stored executable when one fits (no tracing).

    Without :func:`enable_persistent_cache` this is the plain jit call. Otherwise the
    executable for (``name``, ``static``, the shapes, dtypes and placements of ``args`` (the
    devices and the split of each JAX array: :func:`_placement`), the fingerprint) is
    loaded onto those devices from the store, or compiled and stored on a miss (atomically, through the writer given
    to :func:`enable_persistent_cache`); a file whose digest does not match is not deserialized,
    and it and a file that fails to load are replaced.

    Only for programs without custom calls (LAPACK, FFI): a deserialized executable refers to
    them by a handler the new process may not have registered yet (the fit's solve has none).

    Args:
        name: the program's name (part of the key).
        jitted: a ``jax.jit`` function whose static arguments come first.
        static: its static arguments (hashable; ``repr`` is part of the key).
        args: its array arguments (a tuple of pytrees of numpy or JAX arrays: arrays placed on
            several devices, e.g. by :func:`cb_core.mesh.put`, run the program partitioned there).
        out_example: a pytree of the output's structure (the leaves are ignored).
    """
    if _EXECUTABLES is None:
        return jitted(*static, *args)
    import jax
    import numpy as np
    from jax.experimental import serialize_executable

    leaves, tree = jax.tree_util.tree_flatten(args)
    placements = [_placement(x) for x in leaves]
    key = json.dumps(dict(name=name, static=repr(static), tree=str(tree),
                          avals=[(np.shape(x), str(x.dtype if hasattr(x, "dtype") else np.result_type(x)))
                                 for x in leaves],
                          placements=placements, x64=bool(jax.config.jax_enable_x64), **_fingerprint()), sort_keys=True)
    path = _EXECUTABLES / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:32]}.bin"
    if path in _LOADED:
        return _LOADED[path](*args)
    in_tree = jax.tree_util.tree_structure((args, {}))
    out_tree = jax.tree_util.tree_structure(out_example)
    try:
        blob = unseal(path.read_bytes())
    except OSError:  # no such file (a miss), or unreadable
        blob = None
    if blob is not None:
        try:
            # on the devices the arguments lie on (host arrays only: where jit puts them, this
            # host's default device; JAX would otherwise bind the executable to every device)
            devices = next((d for d in map(_devices, leaves) if d is not None), None) or [jax.local_devices()[0]]
            compiled = serialize_executable.deserialize_and_load(blob, in_tree, out_tree, backend=devices[0].client,
                                                                  execution_devices=devices)
            # block: a broken executable fails when it runs, and dispatch is asynchronous
            out = jax.block_until_ready(compiled(*args))
            _LOADED[path] = compiled
            return out
        except Exception:  # noqa: BLE001 - a stale, torn or broken file: compile and store again
            pass
    with _fresh_compilation():
        compiled = _LOADED[path] = jitted.lower(*static, *args).compile()
    try:
        blob, _, _ = serialize_executable.serialize(compiled)
    except (ValueError, NotImplementedError):
        blob = None  # not serializable here: run it anyway
    if blob is not None:
        try:
            _WRITE(path, seal(blob))
        except OSError as err:  # a file in the folder's place, no permission, a full disk: run it anyway
            _cannot_store(_EXECUTABLES, err)
    return compiled(*args)
