"""Labelled decision sets: the data the concept model is fitted on, their checks and layouts.

A *decision* (seed paper, Sec. 3) is one agent step with a finite candidate set of M_i >= 1
actions; a *labelled* decision also says which one the expert took. N labelled decisions are
stored *ragged*: their candidate rows are stacked into T = sum_i M_i rows, decision i owning rows
``offsets[i]:offsets[i+1]``.

This module holds the :class:`LabelledDecisions` pytree (a data set for fitting; a decision taken
at play time is :class:`cb_core.model.DeviceDecision` on the device and
``agent_shell.lm.scores.Decided`` on the host), its validation (host-side, numpy), the padded
``[N_pad, M_pad, .]`` + mask layout every kernel computes on (:class:`PaddedLabelledDecisions`,
built once at the jit boundary by :func:`to_padded`) and the shape *buckets* that let nearby sizes
share compiled code. The ``.npz`` decision-set file is read and written by
:mod:`cb_core.decision_file`. The names ``Decisions`` and ``PaddedDecisions`` are deprecated
aliases of the two classes (a DeprecationWarning when used).

Imports nothing else of this project and no JAX at module import time except for pytree
registration.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence

import jax
from jax.typing import ArrayLike, DTypeLike
import numpy as np

__all__ = [
    "LabelledDecisions",
    "PaddedLabelledDecisions",
    "bucket_size",
    "decisions_from_lists",
    "validate_decisions",
    "to_padded",
]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LabelledDecisions:
    """A data set for fitting: N ragged expert-labelled decisions with T candidate rows in total (a
    JAX pytree; all fields are arrays).

    Attributes:
        hidden: [T, d] float, raw LM hidden states (one row per candidate).
        log_q: [T] float, summed action-token log-probabilities (natural log, nats).
        n_tokens: [T] int, action token counts (>= 1).
        offsets: [N+1] int, decision i owns rows ``offsets[i]:offsets[i+1]``.
        segment_ids: [T] int, the decision each row belongs to (non-decreasing).
        expert: [N] int, index of the expert action within its own candidate set.

    Build one with :func:`decisions_from_lists` or :func:`load_decisions`, which validate;
    the constructor itself does not check (it must stay traceable).
    """

    hidden: ArrayLike
    log_q: ArrayLike
    n_tokens: ArrayLike
    offsets: ArrayLike
    segment_ids: ArrayLike
    expert: ArrayLike

    @property
    def n_decisions(self) -> int:
        """N, the number of decisions."""
        return int(self.offsets.shape[0]) - 1

    @property
    def hidden_size(self) -> int:
        """d, the raw hidden size (the feature size is d + 1)."""
        return int(self.hidden.shape[1])

    @property
    def n_rows(self) -> int:
        """T, the total number of candidate rows."""
        return int(self.hidden.shape[0])

    @property
    def set_sizes(self) -> np.ndarray:
        """[N] int64, the candidate-set sizes M_i."""
        return np.diff(np.asarray(self.offsets)).astype(np.int64)


#: Deprecated names -> their classes (module ``__getattr__``; removed in the next release).
_DEPRECATED = {"Decisions": "LabelledDecisions", "PaddedDecisions": "PaddedLabelledDecisions"}


def _deprecated(name: str, where: str):
    """The class a deprecated name stands for, with a DeprecationWarning naming its new name;
    AttributeError for any other ``name`` (a module ``__getattr__``'s contract)."""
    if name not in _DEPRECATED:
        raise AttributeError(f"module {where!r} has no attribute {name!r}")
    import warnings

    warnings.warn(f"{where}.{name} is deprecated: use {where}.{_DEPRECATED[name]} (a data set of labelled "
                  "decisions for fitting)", DeprecationWarning, stacklevel=3)
    return globals()[_DEPRECATED[name]]


def __getattr__(name: str):
    return _deprecated(name, __name__)


def bucket_size(n: int, minimum: int = 8, steps_per_octave: int = 4) -> int:
    """Smallest bucket >= n among ``minimum`` and the numbers (k + j/steps) * 2**e.

    With 4 steps per octave the buckets are ..., 64, 80, 96, 112, 128, 160, ...: at most 25%
    padding, and at most 4 compiled shapes per doubling of the data, so repeated fits on
    nearby shapes reuse compiled code.
    """
    if n <= minimum:
        return minimum
    e = max(int(np.ceil(np.log2(n))) - 1, 0)  # 2**e < n <= 2**(e+1)
    base = 2**e
    step = max(base // steps_per_octave, 1)
    return int(-(-n // step) * step)


def _validate_arrays(
    hidden: np.ndarray,
    log_q: np.ndarray,
    n_tokens: np.ndarray,
    offsets: np.ndarray,
    expert: np.ndarray,
    finite_hidden: bool = True,
) -> None:
    """Raise ValueError naming the field or the first decision at fault (``finite_hidden=False``
    skips the one check that reads all of ``hidden``: for a caller that checks it on the way)."""
    if hidden.ndim != 2:
        raise ValueError(f"hidden must be [T, d], got shape {hidden.shape}")
    for name, arr in (("hidden", hidden), ("log_q", log_q), ("n_tokens", n_tokens), ("offsets", offsets),
                      ("expert", expert)):
        check_real(name, arr)
    t, d = hidden.shape
    if d < 1:
        raise ValueError("hidden has zero columns (d = 0)")
    for name, arr in (("log_q", log_q), ("n_tokens", n_tokens)):
        if arr.shape != (t,):
            raise ValueError(f"{name} must be [T] = [{t}] to match hidden, got shape {arr.shape}")
    if offsets.ndim != 1 or offsets.shape[0] < 2:
        raise ValueError(f"offsets must be [N+1] with N >= 1, got shape {offsets.shape}")
    if not np.issubdtype(offsets.dtype, np.integer):
        raise ValueError(f"offsets must be integer, got dtype {offsets.dtype}")
    # offsets before expert: N is read from offsets, so offsets that end early or start late
    # would otherwise surface as an expert shape problem
    if offsets[0] != 0:
        raise ValueError(f"offsets[0] must be 0, got {offsets[0]}")
    if offsets[-1] != t:
        raise ValueError(f"offsets[-1] must equal T = {t} (rows of hidden), got {offsets[-1]}")
    n = offsets.shape[0] - 1
    if expert.shape != (n,):
        raise ValueError(f"expert must be [N] = [{n}] to match offsets, got shape {expert.shape}")
    if not np.issubdtype(n_tokens.dtype, np.integer):
        raise ValueError(f"n_tokens must be integer, got dtype {n_tokens.dtype}")
    if not np.issubdtype(expert.dtype, np.integer):
        raise ValueError(f"expert must be integer, got dtype {expert.dtype}")
    sizes = np.diff(offsets)
    bad = np.flatnonzero(sizes < 1)
    if bad.size:
        raise ValueError(f"decision {bad[0]} has an empty candidate set (offsets {offsets[bad[0]]}"
                         f"..{offsets[bad[0] + 1]})")
    bad = np.flatnonzero((expert < 0) | (expert >= sizes))
    if bad.size:
        i = bad[0]
        raise ValueError(f"decision {i}: expert index {expert[i]} outside its candidate set of "
                         f"size {sizes[i]}")
    seg = np.repeat(np.arange(n), sizes)
    for name, arr in (("hidden", hidden), ("log_q", log_q))[0 if finite_hidden else 1:]:
        finite = np.isfinite(arr)
        if not finite.all():
            rows = np.flatnonzero(~finite.reshape(t, -1).all(axis=1))
            i = seg[rows[0]]
            raise ValueError(f"decision {i}: non-finite {name} (candidate {rows[0] - offsets[i]})")
    bad = np.flatnonzero(n_tokens < 1)
    if bad.size:
        i = seg[bad[0]]
        raise ValueError(f"decision {i}: n_tokens {n_tokens[bad[0]]} < 1 "
                         f"(candidate {bad[0] - offsets[i]})")


def check_real(name: str, arr: np.ndarray, where: str = "") -> None:
    """Refuse an array that does not hold real numbers (strings, complex numbers, objects, bools):
    one line naming the field (``where``: e.g. ``"decision 3: "``) and its dtype."""
    if arr.dtype.kind not in "fiu":
        raise ValueError(f"{where}{name} must hold real numbers, got dtype {arr.dtype} "
                         f"({'complex' if arr.dtype.kind == 'c' else 'text' if arr.dtype.kind in 'US' else arr.dtype.kind})")


def _integers(name: str, values: ArrayLike, where: str = "", per_decision: bool = False) -> np.ndarray:
    """``values`` as int64, refusing entries that are not whole numbers (2.5 is not truncated to 2);
    ``per_decision``: entry i belongs to decision i (the message names it)."""
    arr = np.asarray(values)
    check_real(name, arr, where)
    if not np.issubdtype(arr.dtype, np.integer):
        bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
        if bad.size:
            at = f"decision {bad[0]}: {name}" if per_decision else f"{where}{name}"
            raise ValueError(f"{at} {arr.reshape(-1)[bad[0]].item()!r} is not a whole number")
    return arr.astype(np.int64)


def _overflow(name: str, arr: np.ndarray, float_dtype, offsets: np.ndarray) -> None:
    """Refuse finite values of a wider float that ``float_dtype`` cannot hold (they would become
    infinite), naming the decision and candidate."""
    if arr.dtype.itemsize <= np.dtype(float_dtype).itemsize or arr.size == 0:
        return
    limit = np.finfo(float_dtype).max
    rows = np.flatnonzero((np.abs(arr) > limit).reshape(arr.shape[0], -1).any(axis=1))
    if rows.size:
        i = int(np.searchsorted(offsets, rows[0], side="right") - 1)
        raise ValueError(f"decision {i}: {name} of candidate {rows[0] - offsets[i]} holds "
                         f"{float(np.abs(arr[rows[0]]).max()):.4g}, past {np.dtype(float_dtype).name}'s largest "
                         f"{limit:.4g} (it would become infinite): scale the features down")


def _from_arrays(hidden, log_q, n_tokens, offsets, expert, *, float_dtype=np.float32,
                 finite_hidden: bool = True) -> LabelledDecisions:
    hidden = np.asarray(hidden)
    log_q = np.asarray(log_q)
    n_tokens = np.asarray(n_tokens)
    offsets = np.asarray(offsets)
    expert = np.asarray(expert)
    _validate_arrays(hidden, log_q, n_tokens, offsets, expert, finite_hidden)
    _overflow("hidden", hidden, float_dtype, offsets)
    _overflow("log_q", log_q, float_dtype, offsets)
    sizes = np.diff(offsets)
    return LabelledDecisions(
        hidden=hidden.astype(float_dtype, copy=False),
        log_q=log_q.astype(float_dtype, copy=False),
        n_tokens=n_tokens.astype(np.int32, copy=False),
        offsets=offsets.astype(np.int64, copy=False),
        segment_ids=np.repeat(np.arange(sizes.size, dtype=np.int32), sizes),
        expert=expert.astype(np.int32, copy=False),
    )


def validate_decisions(decisions: LabelledDecisions, *, finite_hidden: bool = True) -> LabelledDecisions:
    """Check a :class:`LabelledDecisions` built by hand; returns it normalised (numpy; float64 stays
    float64, other floats become float32).

    ``finite_hidden=False`` skips the check that every hidden state is finite (the only one that
    reads all of ``hidden``), for a caller that checks it on its way through the data (the fit
    does, in its features' statistics, and then calls this again to name the culprit).

    Raises:
        ValueError: naming the decision at fault (empty candidate set, expert index outside its
            set, non-finite hidden or log_q, n_tokens < 1) or the mismatched field.
    """
    hidden = np.asarray(decisions.hidden)
    float_dtype = np.float64 if hidden.dtype == np.float64 else np.float32
    out = _from_arrays(hidden, decisions.log_q, decisions.n_tokens, decisions.offsets,
                       decisions.expert, float_dtype=float_dtype, finite_hidden=finite_hidden)
    seg = np.asarray(decisions.segment_ids)
    if seg.shape != out.segment_ids.shape or not np.array_equal(seg, out.segment_ids):
        raise ValueError("segment_ids disagree with offsets")
    return out


def decisions_from_lists(
    hidden: Sequence[ArrayLike],
    log_q: Sequence[ArrayLike],
    n_tokens: Sequence[ArrayLike],
    expert: Sequence[int],
) -> LabelledDecisions:
    """Stack per-decision arrays into a validated ragged :class:`LabelledDecisions` (float32).

    Args:
        hidden: N arrays [M_i, d] of raw hidden states.
        log_q: N arrays [M_i] of summed action-token log-probabilities.
        n_tokens: N arrays [M_i] of action token counts (>= 1).
        expert: N local expert indices, 0 <= expert[i] < M_i.

    Raises:
        ValueError: naming the decision at fault: lists of different lengths, an empty
            candidate set, mismatched shapes or hidden sizes, an expert index outside its set or
            not a whole number (2.5 is refused, not truncated), values that are not real numbers
            (strings, complex), non-finite values or values float32 cannot hold, n_tokens < 1.
    """
    n = len(hidden)
    for name, seq in (("log_q", log_q), ("n_tokens", n_tokens), ("expert", expert)):
        if len(seq) != n:
            raise ValueError(f"{name} has {len(seq)} entries but hidden has {n} decisions")
    if n == 0:
        raise ValueError("no decisions given")
    hs, lqs, nts = [], [], []
    d = None
    for i in range(n):
        h = np.asarray(hidden[i])
        check_real("hidden", h, f"decision {i}: ")
        if h.ndim != 2:
            raise ValueError(f"decision {i}: hidden must be [M_i, d], got shape {h.shape}")
        if h.shape[0] == 0:
            raise ValueError(f"decision {i} has an empty candidate set")
        if d is None:
            d = h.shape[1]
        elif h.shape[1] != d:
            raise ValueError(f"decision {i}: hidden size {h.shape[1]} differs from {d} "
                             "(decision 0)")
        lq = np.asarray(log_q[i]).reshape(-1) if np.ndim(log_q[i]) else np.asarray([log_q[i]])
        nt = np.asarray(n_tokens[i]).reshape(-1) if np.ndim(n_tokens[i]) else np.asarray([n_tokens[i]])
        if lq.shape != (h.shape[0],) or nt.shape != (h.shape[0],):
            raise ValueError(f"decision {i}: log_q {lq.shape} and n_tokens {nt.shape} must both "
                             f"be [M_i] = [{h.shape[0]}]")
        check_real("log_q", lq, f"decision {i}: ")
        nt = _integers("n_tokens", nt, f"decision {i}: ")
        hs.append(h)
        lqs.append(lq)
        nts.append(nt)
    sizes = np.array([h.shape[0] for h in hs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return _from_arrays(np.concatenate(hs), np.concatenate(lqs), np.concatenate(nts), offsets,
                        _integers("expert index", list(expert), per_decision=True))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PaddedLabelledDecisions:
    """The padded layout every kernel of :mod:`cb_core.model` computes on (a pytree of arrays).

    N labelled decisions padded to N_pad, each candidate set padded to M_pad slots. Built once, on
    the host, by :func:`to_padded` (the jit boundary). The kernels that act on one candidate set
    (:class:`cb_core.Concept`) use the same layout with N_pad = 1 and a placeholder label (expert 0,
    which scoring never reads).

    Attributes:
        hidden: [N_pad, M_pad, d] float, each candidate's hidden state minus the first
            candidate's of its set (the features are invariant to a per-set shift; the shift
            makes a coordinate that is constant within a set exactly 0 and keeps float32 sums
            well conditioned); 0 in padded slots.
        log_q: [N_pad, M_pad] float, summed action-token log-probabilities (nats); 0 in padded
            slots.
        n_tokens: [N_pad, M_pad] int32, action token counts; 1 in padded slots.
        mask: [N_pad, M_pad] bool, True for real candidates.
        expert: [N_pad] int32, local expert index (0 for padded decisions).
        weight: [N_pad] float, 1 for real decisions, 0 for padded ones.
    """

    hidden: ArrayLike
    log_q: ArrayLike
    n_tokens: ArrayLike
    mask: ArrayLike
    expert: ArrayLike
    weight: ArrayLike

    def unpad(self, x: ArrayLike) -> ArrayLike:
        """Rows of ``x`` [N_pad, M_pad, ...] for the real candidates, in ragged order [T, ...]."""
        rows = np.flatnonzero(np.asarray(self.mask).reshape(-1))
        return x.reshape((-1,) + tuple(x.shape[2:]))[rows]


def _aligned_zeros(shape: tuple[int, ...], dtype: DTypeLike, align: int = 64) -> np.ndarray:
    """Zero-filled array whose data start on an ``align``-byte boundary (JAX's CPU client then
    aliases it in ``jax.device_put`` and jit calls instead of copying)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    buf = np.zeros(nbytes + align, np.uint8)
    start = (-buf.ctypes.data) % align
    return buf[start:start + nbytes].view(dtype).reshape(shape)


_COPY_THREADS = min(4, os.cpu_count() or 1)
_COPY_CHUNK_BYTES = 8 << 20  # a thread per 8 MiB at least


@functools.lru_cache(maxsize=1)
def _copy_pool():
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(_COPY_THREADS, thread_name_prefix="cb_core-pad")


def to_padded(decisions: LabelledDecisions, *, dtype: DTypeLike | None = None, n_pad: int | None = None,
              m_pad: int | None = None) -> PaddedLabelledDecisions:
    """Pad ragged decisions into the kernels' layout, once, on the host (numpy out).

    Args:
        decisions: validated ragged decisions (numpy arrays).
        dtype: float dtype of ``hidden`` and ``log_q``; default float64 if ``decisions.hidden``
            is float64, else float32.
        n_pad: decision slots, default :func:`bucket_size` (N) (minimum 8).
        m_pad: candidate slots, default :func:`bucket_size` (M_max) (minimum 8).

    Shape buckets make nearby data sizes share one compiled program. One pass over the hidden
    states (the shift by each set's first row happens in the copy, split over up to four threads
    when it is large).

    Raises:
        ValueError: if n_pad < N or m_pad < M_max.
    """
    offsets = np.asarray(decisions.offsets)
    sizes = np.diff(offsets)
    n, m_max = sizes.size, int(sizes.max())
    n_pad = bucket_size(n) if n_pad is None else int(n_pad)
    m_pad = bucket_size(m_max) if m_pad is None else int(m_pad)
    if n_pad < n or m_pad < m_max:
        raise ValueError(f"padding ({n_pad}, {m_pad}) smaller than data ({n}, {m_max})")
    hidden = np.asarray(decisions.hidden)
    if dtype is None:
        dtype = np.float64 if hidden.dtype == np.float64 else np.float32
    h = _aligned_zeros((n_pad, m_pad, hidden.shape[1]), dtype)

    def copy(lo: int, hi: int) -> None:
        with np.errstate(invalid="ignore", over="ignore"):  # a non-finite input: the fit names it
            for i in range(lo, hi):
                a, b = offsets[i], offsets[i + 1]
                np.subtract(hidden[a:b], hidden[a], out=h[i, : b - a], dtype=dtype)

    workers = min(_COPY_THREADS, n, max(1, h.nbytes // _COPY_CHUNK_BYTES))
    if workers > 1:  # numpy releases the GIL in the copy: the cores share a large one
        cuts = np.searchsorted(offsets, np.linspace(0, offsets[-1], workers + 1)[1:-1])
        bounds = np.concatenate([[0], cuts, [n]])
        list(_copy_pool().map(copy, bounds[:-1], bounds[1:]))
    else:
        copy(0, n)
    seg = np.repeat(np.arange(n), sizes)
    local = np.arange(seg.size) - offsets[seg]
    log_q = np.zeros((n_pad, m_pad), dtype)
    log_q[seg, local] = np.asarray(decisions.log_q)
    n_tokens = np.ones((n_pad, m_pad), np.int32)
    n_tokens[seg, local] = np.asarray(decisions.n_tokens)
    mask = np.zeros((n_pad, m_pad), bool)
    mask[seg, local] = True
    expert = np.zeros(n_pad, np.int32)
    expert[:n] = np.asarray(decisions.expert)
    weight = np.zeros(n_pad, dtype)
    weight[:n] = 1.0
    return PaddedLabelledDecisions(h, log_q, n_tokens, mask, expert, weight)
