"""The decision-set file: a ragged :class:`cb_core.decisions.LabelledDecisions` as one ``.npz`` archive.

Decision-set file (``.npz``, written by :func:`write_decisions`, read by :func:`load_decisions`):

==============  ==========  =======  =====================================================
key             shape       dtype    meaning
==============  ==========  =======  =====================================================
``hidden``      [T, d]      float32  raw LM hidden state at each candidate's last token
``log_q``       [T]         float32  summed log-probability of the candidate's action tokens
``n_tokens``    [T]         int      number of action tokens (>= 1)
``offsets``     [N+1]       int64    decision i owns rows offsets[i]:offsets[i+1]; offsets[0]=0
``expert``      [N]         int64    index of the expert action *within* its candidate set
``metadata``    [] (str)    unicode  optional JSON object (backbone, features, task_type, ...)
==============  ==========  =======  =====================================================

Any extractor can write this file with ``numpy.savez``; ``cb-agent fit FILE --out CONCEPT``
fits a concept on it. Before any member is loaded, its ``.npy`` header is read: its declared
shape and dtype must match the bytes the archive stores for it, and the members read must
together stay under ``max_bytes`` (default :data:`MAX_BYTES`), so a crafted header or a small
compressed member that inflates hugely is refused before anything is allocated or inflated.

cb_core writes no files: :func:`write_decisions` writes to a binary file the caller opened (the
agent shell writes through :func:`cb_io.storage.atomic_path`). Imports nothing else of this
project.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from typing import BinaryIO

import numpy as np

from cb_core.decisions import LabelledDecisions, _from_arrays, validate_decisions

__all__ = ["MAX_BYTES", "METADATA_FIELDS", "check_decisions_metadata", "load_decisions", "load_decisions_metadata",
           "write_decisions"]

_REQUIRED = ("hidden", "log_q", "n_tokens", "offsets", "expert")

#: Default cap on the bytes the members of one decision-set file may declare (4 GiB: the fit
#: holds a few padded copies of ``hidden``, which must fit beside the LM on a 24 GiB machine).
MAX_BYTES = 4 << 30


def _read_members(path: str | os.PathLike, names: tuple[str, ...], max_bytes: int,
                  required: bool = True) -> dict[str, np.ndarray]:
    """The members ``names`` of the ``.npz`` at ``path`` (absent ones left out unless
    ``required``), each loaded only after its ``.npy`` header was checked against the bytes the
    archive stores for it and the members' declared bytes together against ``max_bytes``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a zip archive, a missing member (``required``), a header that is not an
            ``.npy`` header, declares an object dtype, or disagrees with the stored size, or
            members over ``max_bytes`` (naming the file and member).
    """
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    if not zipfile.is_zipfile(path):  # numpy would otherwise read any other file as a pickle
        raise ValueError(f"{path}: not a decision-set .npz file (not a zip archive as "
                         "numpy.savez writes; see cb_core.decision_file for the format)")
    total = 0
    with zipfile.ZipFile(path) as archive:
        stored = {info.filename.removesuffix(".npy"): info for info in archive.infolist()}
        missing = [k for k in names if k not in stored]
        if missing and required:
            raise ValueError(f"{path}: missing field(s) {', '.join(missing)} "
                             f"(has {', '.join(sorted(stored)) or 'nothing'})")
        present = [k for k in names if k in stored]
        for name in present:
            info = stored[name]
            with archive.open(info) as member:  # inflates only the header's few bytes
                try:
                    version = np.lib.format.read_magic(member)
                    read = {(1, 0): np.lib.format.read_array_header_1_0,
                            (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                    if read is None:
                        raise ValueError(f".npy format version {version} is not supported")
                    shape, _fortran, dtype = read(member)
                except ValueError as err:
                    raise ValueError(f"{path}: field {name} has no valid .npy header ({err})") from None
                offset = member.tell()
            if dtype.hasobject:
                raise ValueError(f"{path}: field {name} holds Python objects (dtype {dtype}); "
                                 "a decision-set file holds numbers and one JSON string")
            declared = math.prod(shape) * dtype.itemsize
            if info.file_size != offset + declared:
                raise ValueError(f"{path}: field {name} declares {dtype} {tuple(shape)} ({declared} bytes) "
                                 f"but the archive stores {info.file_size - offset} bytes for it")
            total += declared
            if total > max_bytes:
                raise ValueError(f"{path}: the fields declare over {max_bytes / 2**30:.3g} GiB "
                                 f"(field {name}: {dtype} {tuple(shape)}); raise the cap "
                                 "(cb-agent fit --max-gib) if this machine has the memory")
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in present}


def load_decisions(path: str | os.PathLike, max_bytes: int = MAX_BYTES) -> LabelledDecisions:
    """Read a decision-set ``.npz`` (format in this module's docstring) and validate it.

    Args:
        path: the file.
        max_bytes: cap on the bytes the required members declare together (checked on their
            headers before anything is loaded).

    Raises:
        ValueError: not an ``.npz`` archive (naming the file), or naming the missing or
            malformed field (a header that disagrees with its stored size, over ``max_bytes``),
            the decision at fault, or a ``metadata`` field :func:`check_decisions_metadata` refuses.
        FileNotFoundError: if the file does not exist.
        MemoryError: the machine cannot hold the arrays (under ``max_bytes``).
    """
    arrays = _read_members(path, _REQUIRED, max_bytes)
    load_decisions_metadata(path)  # the fields a concept takes from it: refused here as `cb-agent fit` refuses them
    for k in ("hidden", "log_q"):
        if not np.issubdtype(arrays[k].dtype, np.floating):
            raise ValueError(f"{path}: field {k} must be float, got dtype {arrays[k].dtype}")
    try:
        return _from_arrays(**arrays)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def load_decisions_metadata(path: str | os.PathLike, max_bytes: int = 16 << 20) -> dict:
    """The optional JSON ``metadata`` object of a decision-set file ({} when absent).

    Raises:
        ValueError: if the field is present but not a JSON object, declares over ``max_bytes``
            (default 16 MiB), or holds a field :func:`check_decisions_metadata` refuses.
    """
    raw = _read_members(path, ("metadata",), max_bytes, required=False).get("metadata")
    if raw is None:
        return {}
    try:
        meta = json.loads(str(raw[()]))
    except (json.JSONDecodeError, TypeError, IndexError) as err:
        raise ValueError(f"{path}: field metadata is not JSON: {err}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: field metadata must be a JSON object, got {type(meta).__name__}")
    check_decisions_metadata(meta, str(path))
    return meta


#: The metadata fields a concept fitted on a decision-set file takes from it -> their JSON types.
METADATA_FIELDS = {"backbone": (str,), "task_type": (str,), "features": (str, dict), "trajectories": (list,)}


def check_decisions_metadata(meta: dict, where: str) -> None:
    """The one check of a decision-set file's metadata (:func:`load_decisions`,
    :func:`load_decisions_metadata`, ``cb-agent fit``): each field of :data:`METADATA_FIELDS`,
    when present, has its type, and ``trajectories`` lists strings. Other fields are kept as they are.

    Raises:
        ValueError: one line naming ``where``, the field and the value.
    """
    for field, types in METADATA_FIELDS.items():
        if field in meta and not isinstance(meta[field], types):
            raise ValueError(f"{where}: metadata {field!r} must be {' or '.join(t.__name__ for t in types)}, "
                             f"got {meta[field]!r}"[:300])
    bad = [t for t in meta.get("trajectories", []) if not isinstance(t, str)]
    if bad:
        raise ValueError(f"{where}: metadata 'trajectories' must list strings, got {bad[0]!r}")


def write_decisions(file: BinaryIO, decisions: LabelledDecisions, metadata: dict | None = None) -> None:
    """Write a decision-set ``.npz`` to ``file`` (a binary file opened for writing); validates
    first. To write a path atomically: ``with cb_io.storage.atomic_path(path, suffix=".npz") as
    tmp, open(tmp, "wb") as f: write_decisions(f, decisions)``.

    Raises:
        ValueError: as :func:`validate_decisions`, or metadata :func:`check_decisions_metadata` refuses.
    """
    dec = validate_decisions(decisions)
    arrays = dict(hidden=np.asarray(dec.hidden, np.float32), log_q=np.asarray(dec.log_q, np.float32),
                  n_tokens=np.asarray(dec.n_tokens, np.int64), offsets=np.asarray(dec.offsets, np.int64),
                  expert=np.asarray(dec.expert, np.int64))
    if metadata is not None:
        check_decisions_metadata(metadata, "write_decisions")
        arrays["metadata"] = np.asarray(json.dumps(metadata))
    np.savez(file, **arrays)
