"""JSON files of the project, one owner: durable JSONL appends and reads, atomic replacement.

Every JSONL file the project writes (expert trajectories, episode results, study lines, ICAL
outputs) is appended with :func:`append_jsonl` and read with :func:`iter_jsonl`; every file that
is written or rewritten as a whole (an episode's partial state, cached reviews, indexes, concept
and decision-set files, cb_core's stored executables, charts and tables) is replaced with
:func:`atomic_path` / :func:`write_bytes_atomic` / :func:`write_json_atomic`, the project's one
atomic writer (a link at the path is replaced, never followed); :func:`repair_jsonl` moves a torn
line aside (what every ``--resume`` runs first); :func:`atomic_folder` replaces a whole folder (cached
concepts) in one rename, and :func:`stamped_folder` builds one (an extracted or converted model)
once per source; :func:`claim_writer` gives one process at a time the right to append to a
file. (cb_core writes no files: its callers write what it serialises through this module.)

Temporary files and folders of the atomic writers are named ``<name>.tmp-<host>-<pid>-<random>``
beside their target; a write killed part-way (SIGKILL, a lost machine) leaves one, and the next
atomic write into that folder removes it (:func:`remove_leftovers`: its process, on this host, is
gone, or it is older than :data:`LEFTOVER_AGE_S`), so a killed fit leaves no staging folder in the
concept cache and no ``tmp*`` file in an output folder for long.

One rule for links: no file the project writes, whether an output, an appended line, a lock or a
side file beside an output, is written through a symbolic link. The atomic writers replace a link
at the path; every file opened to be written in place is opened with ``O_NOFOLLOW``
(:func:`open_for_writing`), so a link there is refused in one line (:func:`refuse_link`) and the
file it points to is never touched.

Imports no game engine and nothing of the agent shell.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import orjson


#: errno values that say the output's file system cannot take the write (full, over quota,
#: read-only, file too large): the output cannot be written, whatever is written next.
_UNWRITABLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})

#: How often :func:`output_folder` creates a folder that another process keeps removing on the way.
_CREATE_ATTEMPTS = 20


class OutputError(OSError):
    """An output file could not be written because its file system refuses the write (full, over
    quota, read-only) or a regular file stands where its folder would be: no episode's fault, and
    no retry helps. The message is one line naming the file (and the free space, or the file on the way)."""

    def __str__(self) -> str:
        return str(self.strerror)


def output_folder(path: str | os.PathLike) -> str:
    """The folder of the output file ``path`` (absolute), created with its parents if missing.

    A folder on the way that another process removes while this one creates it (a clean-up of
    emptied folders) is created again: only a regular file on the way is refused.

    Raises:
        OutputError: a regular file stands on the way: ``"cannot write <path>: <file> is a file, not a
            folder; choose another path"``.
    """
    directory = os.path.dirname(os.path.abspath(path))
    attempts = _CREATE_ATTEMPTS
    while True:
        try:
            os.makedirs(directory, exist_ok=True)
            return directory
        except (FileExistsError, NotADirectoryError) as err:
            nearest = next((p for p in (directory, *Path(directory).parents) if os.path.lexists(p)), None)
            if nearest is not None and not os.path.isdir(nearest):
                raise OutputError(err.errno, f"cannot write {os.fspath(path)}: {nearest} is a file, not a "
                                             "folder; choose another path") from None
            attempts -= 1
            if not attempts:  # removed every time: the error passes (an episode's fault, retried)
                raise


@contextlib.contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Turn an OSError of a full, over-quota or read-only file system raised inside the block into
    an :class:`OutputError` naming ``path`` and the free space on its file system; every other
    exception passes unchanged."""
    try:
        yield
    except OutputError:
        raise
    except OSError as err:
        if err.errno not in _UNWRITABLE:
            raise
        try:
            free = f"{shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free:,} bytes free"
        except OSError:
            free = "free space unknown"
        raise OutputError(err.errno, f"cannot write {os.fspath(path)}: {err.strerror} ({free} on its file "
                                     "system); make room, then the same command with --resume continues") from None


def refuse_link(path: str | os.PathLike, instead: str = "choose another output directory") -> None:
    """ValueError (one line) when ``path`` is a symbolic link: an output is never written through
    one (it would change the file the link points to)."""
    if os.path.islink(path):
        raise ValueError(f"{path} is a symbolic link (to {os.readlink(path)}); an output is never written "
                         f"through a link: remove it, or {instead}")


def open_for_writing(path: str | os.PathLike, flags: int) -> int:
    """``os.open(path, flags | O_NOFOLLOW, 0o644)``: the descriptor of a file written in place
    (appended, locked), never through a link.

    Raises:
        ValueError: ``path`` is a symbolic link (:func:`refuse_link`), one line.
        OSError: any other failure to open it.
    """
    try:
        return os.open(path, flags | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            refuse_link(path)
        raise


def append_jsonl(path: str | os.PathLike, record: Mapping[str, Any] | Any) -> None:
    """Append one record (a JSON object, or anything with ``to_record()``) as one line, durably.

    Approach: the whole line (JSON + ``\\n``) is encoded first and handed to a single
    ``os.write`` on a descriptor opened with ``O_APPEND``, then ``fsync``-ed before returning.
    A line therefore becomes complete in one write call; a crash or kill mid-write can leave at
    most a torn *final* line without its newline. Before appending, a file whose last byte is not
    a newline (a torn line from an earlier crash) gets a newline first, so the torn bytes stay an
    isolated malformed line that :func:`iter_jsonl` reports by line number and the new
    record is never glued onto them. Writers must not run concurrently on one file: a writer that
    resumes a file claims it first (:func:`claim_writer`).

    Raises:
        ValueError: ``path`` is a symbolic link (:func:`open_for_writing`).
        OutputError: the file system is full, over quota or read-only (:func:`writing`).
        OSError: the write or fsync failed otherwise (the caller's record is then not durable).
    """
    if hasattr(record, "to_record"):
        record = record.to_record()
    line = orjson.dumps(record) + b"\n"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with writing(path):
        fd = open_for_writing(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        try:
            size = os.fstat(fd).st_size
            if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line
            view = memoryview(line)
            while view:  # os.write may write fewer bytes (signals, pipes); finish the line
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class MalformedLine:
    """A line that could not be read: its 1-based number and why."""

    line_number: int
    error: str


def iter_jsonl(path: str | os.PathLike,
               parse: Callable[[Any], Any] = lambda record: record) -> Iterator[tuple[int, Any, str | None]]:
    """Yield ``(line number, parse(record), None)`` per good line of a JSONL file, or
    ``(line number, None, why)`` for a malformed one; blank lines are ignored.

    A line without its final newline is torn (an interrupted write) and reported as malformed.
    ``parse`` may raise ValueError to reject a well-formed JSON value. Each reader chooses its own
    policy for bad lines (raise, or skip and report); none drops one silently. A file named
    ``*.gz`` is read through gzip (as the committed results files are stored).

    Raises:
        FileNotFoundError: no such file.
    """
    if os.fspath(path).endswith(".gz"):
        import gzip

        opened = gzip.open(path, "rb")
    else:
        opened = open(path, "rb")
    with opened as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                if not raw.endswith(b"\n"):
                    raise ValueError("truncated line (no final newline; an interrupted write?)")
                value = parse(orjson.loads(raw))
            except (orjson.JSONDecodeError, ValueError) as err:
                yield number, None, str(err)
                continue
            yield number, value, None


class FileBusy(ValueError):
    """Another process holds the claim to write the file (:func:`claim_writer`); the message names it."""


#: This process's claims: absolute path -> (descriptor of the locked sidecar file, pid of the claimer).
_CLAIMS: dict[str, tuple[int, int]] = {}


def _lock_path(path: str) -> str:
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}.lock")


def claim_writer(path: str | os.PathLike) -> None:
    """Claim ``path`` for this process's writes: an exclusive ``fcntl.flock`` on the hidden sidecar
    file ``.<name>.lock`` beside it, which records the holder's pid and command line.

    Claiming a file this process holds already does nothing. The claim lasts until the process
    ends: at a normal exit the sidecar is removed, and the kernel drops the lock of a killed process,
    so a crash never leaves the file claimed. The sidecar folder is created when missing.

    Raises:
        FileBusy: another process holds the claim: ``"<path> is being written by pid <pid> (<command
            line>); wait for it or stop it"``.
        ValueError: the sidecar is a symbolic link (:func:`open_for_writing`: never written through).
    """
    key = os.path.abspath(path)
    if key in _CLAIMS and _CLAIMS[key][1] == os.getpid():
        return
    output_folder(path)  # the sidecar's folder is the file's
    lock = _lock_path(key)
    while True:
        fd = open_for_writing(lock, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise FileBusy(f"{path} is being written by {holder}; wait for it or stop it") from None
        try:
            current = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)  # the last holder removed this sidecar between our open and lock: take the new one
    command = " ".join([os.path.basename(sys.argv[0] if sys.argv else "python"), *sys.argv[1:]])
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} ({command[:300]})\n".encode(), 0)
    _CLAIMS[key] = (fd, os.getpid())


@atexit.register
def _release_all() -> None:
    """Remove this process's sidecars, then unlock them (never a forked child's copy of its parent's
    claims); a waiting claimer then retries on a new sidecar."""
    for key, (fd, pid) in list(_CLAIMS.items()):
        if pid != os.getpid():
            continue
        del _CLAIMS[key]
        with contextlib.suppress(OSError):
            os.unlink(_lock_path(key))
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _default_mode() -> int:
    """0o666 minus the process umask: the mode ``open()`` would give a new file."""
    return 0o666 & ~_umask()


#: This machine's name as temporary names carry it (letters, digits, ``_`` and ``.`` only).
_HOST = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"
#: A temporary entry of :func:`atomic_path` / :func:`atomic_folder`: ``<name>.tmp-<host>-<pid>-<random><suffix>``.
_TEMP = re.compile(r"\.tmp-(?P<host>[A-Za-z0-9_.]+)-(?P<pid>\d+)-[A-Za-z0-9_]+(\.[A-Za-z0-9]+)?$")
#: Temporary entries from before the names carried their writer (``tmpXXXXXXXX.tmp``, ``name.tmp-XXXXXXXX``).
_OLD_TEMP = re.compile(r"^tmp[A-Za-z0-9_]{8}(\.[A-Za-z0-9]+)?$|\.tmp-[A-Za-z0-9_]{8}$")
#: Age past which a temporary entry is a leftover whoever wrote it (no write takes a day).
LEFTOVER_AGE_S = 24 * 3600.0
_SWEPT: set[str] = set()


def _temp_prefix(path: Path) -> str:
    return f"{path.name}.tmp-{_HOST}-{os.getpid()}-"


def _gone(pid: int) -> bool:
    """Whether no process ``pid`` runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it runs, as another user
        return False
    return False


def remove_leftovers(directory: str | os.PathLike, force: bool = False) -> list[str]:
    """Remove the temporary files and folders that killed atomic writes left in ``directory``:
    those whose writing process ran on this host and is gone, and any older than
    :data:`LEFTOVER_AGE_S` (from another host, or named before names carried their writer).
    A temporary entry of a write still running is never touched. Done once per folder and
    process (the atomic writers call it) unless ``force``.

    Returns:
        the names removed.
    """
    key = os.path.abspath(directory)
    if key in _SWEPT and not force:
        return []
    _SWEPT.add(key)
    try:
        entries = list(os.scandir(key))
    except OSError:
        return []
    removed = []
    for entry in entries:
        mine = _TEMP.search(entry.name)
        try:
            if mine is not None and mine["host"] == _HOST:
                stale = int(mine["pid"]) != os.getpid() and _gone(int(mine["pid"]))
            elif mine is not None or _OLD_TEMP.search(entry.name):
                stale = time.time() - entry.stat(follow_symlinks=False).st_mtime > LEFTOVER_AGE_S
            else:
                continue
            if not stale:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed.append(entry.name)
        except OSError:  # removed meanwhile by another process, or not ours to remove
            pass
    return removed


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[str]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` in one rename.
    The leftovers of killed writes in its folder go first (:func:`remove_leftovers`).

    The new file gets the ordinary permissions of a newly created file (not mkstemp's 0600). On
    any exception the temporary file is removed and ``path`` is left untouched. A symbolic link at
    ``path`` is replaced by the new file; the file it pointed to is left untouched. A full,
    over-quota or read-only file system raises :class:`OutputError` (:func:`writing`).
    """
    path = os.fspath(path)
    with writing(path):
        directory = output_folder(path)
        remove_leftovers(directory)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=_temp_prefix(Path(path)), suffix=suffix)
        os.close(fd)
        try:
            yield tmp
            os.chmod(tmp, _default_mode())  # after writing: some writers recreate the file
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike, marker: str | None = None) -> Iterator[Path]:
    """Yield a new temporary folder beside ``path``; on success it replaces ``path`` (an older
    ``path`` is removed first) in one rename, so ``path`` appears complete or not at all.

    When the rename fails because another process put ``path`` in place meanwhile, theirs is kept
    if it holds ``marker`` (a file written last). On any exception the temporary folder is removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(path.parent)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), dir=path.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # a new folder's ordinary mode, not mkdtemp's 0700
        yield tmp
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
        try:
            os.replace(tmp, path)
        except OSError:
            if marker is None or not (path / marker).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` by a file holding ``data`` atomically (:func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(data)


def write_json_atomic(path: str | os.PathLike, payload: object) -> None:
    """Write ``payload`` as JSON (orjson) to ``path`` atomically (:func:`atomic_path`)."""
    write_bytes_atomic(path, orjson.dumps(payload))


def repair_jsonl(path: str | os.PathLike, aside: str | os.PathLike | None = None) -> list[MalformedLine]:
    """Move the unreadable lines of a JSONL file aside, keeping every other byte as it is.

    Unreadable: a torn line (no final newline: an interrupted write) or a line that is not JSON (a
    torn line that a later :func:`append_jsonl` closed with a newline). Lines that are JSON stay,
    whatever their content, so records of another kind are never moved. The unreadable lines are
    appended to ``aside`` (default ``<path>.torn``) and fsync-ed first; then the readable lines, byte
    for byte in their order, replace ``path`` atomically (a temporary file beside it, fsync, one
    rename). An interruption leaves either the old file or the repaired one (and at worst the moved
    lines twice in ``aside``). Run it only while no writer appends to ``path``.

    Returns:
        The moved lines (number in the old file, why); [] when nothing was unreadable (the file is
        then not touched) or the file does not exist.

    Raises:
        ValueError: ``aside`` is a symbolic link (:func:`open_for_writing`; nothing is moved).
    """
    path = Path(path)
    if not path.exists():
        return []
    keep: list[bytes] = []
    moved: list[tuple[MalformedLine, bytes]] = []
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                keep.append(raw)
                continue
            why = None
            if not raw.endswith(b"\n"):
                why = "truncated line (no final newline; an interrupted write?)"
            else:
                try:
                    orjson.loads(raw)
                except orjson.JSONDecodeError as err:
                    why = f"not JSON: {err}"
            if why is None:
                keep.append(raw)
            else:
                moved.append((MalformedLine(number, why), raw if raw.endswith(b"\n") else raw + b"\n"))
    if not moved:
        return []
    aside = Path(aside) if aside is not None else path.with_name(path.name + ".torn")
    fd = open_for_writing(aside, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, b"".join(raw for _, raw in moved))
        os.fsync(fd)
    finally:
        os.close(fd)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(b"".join(keep))
            fh.flush()
            os.fsync(fh.fileno())
    return [line for line, _ in moved]


#: The file inside a :func:`stamped_folder` that records what it was built from.
STAMP_FILE = "cb_agent_source.json"


def stamped_folder(target: str | os.PathLike, stamp: Mapping[str, Any], build: Callable[[Path], None]) -> Path:
    """``target``, built by ``build(folder)`` unless it already holds a folder built from ``stamp``.

    ``build`` writes into a temporary sibling folder (:func:`atomic_folder`), which gets
    ``STAMP_FILE`` (``stamp`` as JSON) and is then renamed into place, so an interrupted or
    concurrent build never leaves a half folder; a stale ``target`` (another stamp) is replaced,
    and when another process finished the same build first, its folder is kept.
    """
    target = Path(target)
    try:
        if orjson.loads((target / STAMP_FILE).read_bytes()) == dict(stamp):
            return target
    except (OSError, ValueError):
        pass
    with atomic_folder(target, marker=STAMP_FILE) as tmp:
        build(tmp)
        (tmp / STAMP_FILE).write_bytes(orjson.dumps(dict(stamp), option=orjson.OPT_INDENT_2))
    return target


__all__ = ["LEFTOVER_AGE_S", "STAMP_FILE", "FileBusy", "MalformedLine", "OutputError", "append_jsonl", "atomic_folder",
           "atomic_path", "claim_writer", "iter_jsonl", "open_for_writing", "output_folder", "refuse_link", "remove_leftovers",
           "repair_jsonl", "stamped_folder", "write_bytes_atomic", "write_json_atomic", "writing"]
