"""The decision-set file: a ragged :class:`cb_core.decisions.Decisions` as one ``.npz`` archive.

Decision-set file (``.npz``, written by :func:`save_decisions`, read by :func:`load_decisions`):

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
fits a concept on it. Imports nothing else of this project.
"""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np

from cb_core._atomic import atomic_path
from cb_core.decisions import Decisions, _from_arrays, validate_decisions

__all__ = ["load_decisions", "load_decisions_metadata", "save_decisions"]

_REQUIRED = ("hidden", "log_q", "n_tokens", "offsets", "expert")


def _check_npz(path: str | os.PathLike) -> None:
    """ValueError unless ``path`` is a zip archive (what ``numpy.savez`` writes): numpy would
    otherwise try to read any other file as a pickle and say so."""
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path}: not a decision-set .npz file (not a zip archive as "
                         "numpy.savez writes; see cb_core.decision_file for the format)")


def load_decisions(path: str | os.PathLike) -> Decisions:
    """Read a decision-set ``.npz`` (format in this module's docstring) and validate it.

    Raises:
        ValueError: not an ``.npz`` archive (naming the file), or naming the missing or
            malformed field, or the decision at fault.
        FileNotFoundError: if the file does not exist.
    """
    _check_npz(path)
    with np.load(path, allow_pickle=False) as z:
        missing = [k for k in _REQUIRED if k not in z.files]
        if missing:
            raise ValueError(f"{path}: missing field(s) {', '.join(missing)} "
                             f"(has {', '.join(z.files) or 'nothing'})")
        arrays = {k: z[k] for k in _REQUIRED}
    for k in ("hidden", "log_q"):
        if not np.issubdtype(arrays[k].dtype, np.floating):
            raise ValueError(f"{path}: field {k} must be float, got dtype {arrays[k].dtype}")
    try:
        return _from_arrays(**arrays)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def load_decisions_metadata(path: str | os.PathLike) -> dict:
    """The optional JSON ``metadata`` object of a decision-set file ({} when absent).

    Raises:
        ValueError: if the field is present but not a JSON object.
    """
    _check_npz(path)
    with np.load(path, allow_pickle=False) as z:
        if "metadata" not in z.files:
            return {}
        raw = z["metadata"]
    try:
        meta = json.loads(str(raw[()]))
    except (json.JSONDecodeError, TypeError) as err:
        raise ValueError(f"{path}: field metadata is not JSON: {err}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: field metadata must be a JSON object, got {type(meta).__name__}")
    return meta


def save_decisions(path: str | os.PathLike, decisions: Decisions, metadata: dict | None = None
                   ) -> None:
    """Write a decision-set ``.npz`` atomically (temp file + rename); validates first.

    Raises:
        ValueError: as :func:`validate_decisions`.
    """
    dec = validate_decisions(decisions)
    arrays = dict(hidden=np.asarray(dec.hidden, np.float32), log_q=np.asarray(dec.log_q, np.float32),
                  n_tokens=np.asarray(dec.n_tokens, np.int64), offsets=np.asarray(dec.offsets, np.int64),
                  expert=np.asarray(dec.expert, np.int64))
    if metadata is not None:
        arrays["metadata"] = np.asarray(json.dumps(metadata))
    with atomic_path(path, suffix=".npz.tmp") as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)
