"""What travels between the host and a compiled program: named records, laid out and read here only.

A pass's integer inputs travel to the device in ONE int32 array, and a decision's outputs come back
in ONE float32 array (one copy each way); what is where in them is decided in this module alone.
Each program has its record of inputs, a named tuple of arrays (:class:`StreamInputs`,
:class:`ScoreInputs`, :class:`DecideInputs`, :class:`RowsInputs`, :class:`CountInputs`), whose fields' shapes follow from
the pass's static sizes (:class:`agent_shell.lm.buckets.Sizes`, a static argument of the program): :func:`pack` lays a
record end to end on the host, :func:`unpack` takes it apart inside the program. Its outputs are
named too (:class:`StreamOutput`, :class:`ScoreOutput`, :class:`DecideOutput`); a decision's
fields (:class:`DecisionFields`) go to the host in one array by :func:`pack_decision` (traced) and
are read there by :func:`read_decision` (which has the head name the culprit of a non-finite input).

Numpy on the host; the traced functions take JAX arrays. Must not import the agents, the
environments, torch or cb_core.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, TypeVar

import numpy as np

from agent_shell.lm.buckets import Sizes
from agent_shell.lm.protocol import DecisionHead, HeadOutput
from agent_shell.lm.scores import CandidateScores, Decided, fetch

if TYPE_CHECKING:
    import jax


def _record(name: str, fields: tuple[str, ...], doc: str) -> type:
    """A named tuple type of arrays (a pytree), ``fields`` in order."""
    kind = NamedTuple(name, [(f, Any) for f in fields])
    kind.__doc__, kind.__module__ = doc, __name__
    return kind


#: The fields every pass over a stream's buffer has.
PASS_FIELDS = ("tokens", "positions", "at", "head", "pair_row", "pair_target")

StreamInputs = _record("StreamInputs", PASS_FIELDS + ("capture", "layers"), """A stream pass's inputs (``stream``):
    ``tokens`` and ``positions`` [t], ``at`` [] (the tokens the buffer holds before), ``head`` [k]
    (the LM head's rows), ``pair_row``/``pair_target`` [p] (the token pairs whose log-probabilities
    are wanted), ``capture`` [c] (tokens whose inner states are kept) at ``layers`` [l].""")
ScoreInputs = _record("ScoreInputs", PASS_FIELDS + ("capture", "layers", "owner", "final"), """A candidates'
    pass (``score``): :class:`StreamInputs`' fields, then each pair's candidate ``owner`` [p] (``m``:
    padding) and each candidate's final head row ``final`` [m].""")
DecideInputs = _record("DecideInputs", PASS_FIELDS + ("owner", "final", "n_tokens", "count"), """A decision's
    pass (``decide``): the candidates' pass without captures, then each candidate's ``n_tokens`` [m]
    (1 in padded slots) and ``count`` [] (M).""")
CountInputs = _record("CountInputs", ("n_tokens", "count"), """A decision on scores already on the device
    (:func:`agent_shell.lm.decision.decide_scores`): each candidate's ``n_tokens`` [m] (1 in padded
    slots) and ``count`` [] (M).""")
RowsInputs = _record("RowsInputs", ("ids", "shared_len", "head", "pair_row", "pair_target", "owner", "final",
                                    "capture", "layers"), """The batched layout's rows over one context
    buffer (``rows``): ``ids`` [rows, width] and ``shared_len`` [] (the context's tokens), then
    :class:`ScoreInputs`' head, pairs, candidates and captures.""")


class StreamOutput(NamedTuple):
    """A stream pass's outputs (device arrays, fetched on demand): the head rows' hidden states
    (float32 [k, D], the LM head's input), greedy's token after each head row int32 [k], the token
    pairs' log-probabilities float32 [p] and the captured layers' states float32 [l, c, D]."""

    hidden: Any
    greedy: Any
    token_lp: Any
    captured: Any

    def first_greedy(self) -> int:
        """Greedy's token after the first head row (a prefill chunk's last token)."""
        return int(fetch(self.greedy)[0])


class ScoreOutput(NamedTuple):
    """A candidates' pass's outputs: ``log_q`` float32 [m], ``hidden`` [m, D] and the captured layers'
    states (None when none were asked for)."""

    log_q: Any
    hidden: Any
    captured: Any


class DecideOutput(NamedTuple):
    """A decision's outputs: the ``record`` fetched to the host (:func:`pack_decision`), and the
    scores it was taken on, left on the device (``log_q`` [m], ``hidden`` [m, D])."""

    record: Any
    log_q: Any
    hidden: Any


DecisionFields = _record("DecisionFields", tuple(HeadOutput.__annotations__), """A decision as it travels to
    the host (:func:`pack_decision`): a head's output (:class:`agent_shell.lm.protocol.HeadOutput`),
    ``log_p``, ``prior``, ``concept_term`` [m], ``chosen`` [] and ``finite`` [] (1.0 or 0.0), all
    float32.""")


#: Each record's fields' shapes from the pass's sizes.
_SHAPES: dict[type, Callable[[Sizes], tuple[tuple[int, ...], ...]]] = {
    StreamInputs: lambda s: ((s.t,), (s.t,), (), (s.k,), (s.p,), (s.p,), (s.c,), (s.l,)),
    ScoreInputs: lambda s: ((s.t,), (s.t,), (), (s.k,), (s.p,), (s.p,), (s.c,), (s.l,), (s.p,), (s.m,)),
    DecideInputs: lambda s: ((s.t,), (s.t,), (), (s.k,), (s.p,), (s.p,), (s.p,), (s.m,), (s.m,), ()),
    CountInputs: lambda s: ((s.m,), ()),
    RowsInputs: lambda s: (tuple(s.t), (), (s.k,), (s.p,), (s.p,), (s.p,), (s.m,), (s.c,), (s.l,)),
    DecisionFields: lambda s: ((s.m,), (s.m,), (s.m,), (), ()),
}
R = TypeVar("R", StreamInputs, ScoreInputs, DecideInputs, CountInputs, RowsInputs, DecisionFields)


def _spans(kind: type, sizes: Sizes) -> list[tuple[int, int, tuple[int, ...]]]:
    """(start, stop, shape) of each field of ``kind`` in its flat array."""
    out, at = [], 0
    for shape in _SHAPES[kind](sizes):
        n = math.prod(shape)
        out.append((at, at + n, shape))
        at += n
    return out


def pack(record: StreamInputs | ScoreInputs | DecideInputs | CountInputs | RowsInputs, sizes: Sizes) -> np.ndarray:
    """int32 [n]: ``record``'s fields end to end (host side).

    Raises:
        ValueError: a field whose shape is not the one ``sizes`` gives it (naming the field).
    """
    spans = _spans(type(record), sizes)
    flat = np.zeros(sum(b - a for a, b, _ in spans), np.int32)
    for name, value, (start, stop, shape) in zip(record._fields, record, spans):
        array = np.asarray(value, np.int32)
        if array.shape != shape:
            raise ValueError(f"{type(record).__name__}.{name}: shape {array.shape}, sizes {sizes} give {shape}")
        flat[start:stop] = array.reshape(-1)
    return flat


def unpack(kind: type[R], sizes: Sizes, flat: Any) -> R:
    """The record of type ``kind`` laid out in ``flat`` by :func:`pack` (traceable: slices of a JAX
    or numpy array)."""
    return kind(*(flat[a:b].reshape(shape) for a, b, shape in _spans(kind, sizes)))


def pack_decision(out: Any) -> jax.Array:
    """float32 [3 m + 2]: a head's output (:class:`agent_shell.lm.protocol.HeadOutput`, each term
    [m]) as the one array fetched to the host (:class:`DecisionFields`, laid out as :func:`unpack`
    reads them). Traceable."""
    import jax.numpy as jnp

    fields = DecisionFields(*(getattr(out, name) for name in DecisionFields._fields))
    spans = _spans(DecisionFields, Sizes(0, 0, 0, m=int(jnp.shape(out.log_p)[0])))
    flat = jnp.zeros(sum(b - a for a, b, _ in spans), jnp.float32)
    for value, (start, stop, _) in zip(fields, spans):
        flat = flat.at[start:stop].set(jnp.reshape(jnp.asarray(value).astype(jnp.float32), -1))
    return flat


def read_decision(record: np.ndarray, count: int, culprit: Callable[[], CandidateScores],
                  decision_head: DecisionHead) -> Decided:
    """The :class:`Decided` of a fetched :func:`pack_decision` record over its first ``count``
    candidates.

    Raises:
        ValueError: the record says an input was not finite: the scores (``culprit()``, fetched only
            then) go through ``decision_head``'s host checks, which name the candidate.
    """
    m = (record.shape[0] - 2) // 3
    fields = unpack(DecisionFields, Sizes(0, 0, 0, m=m), record)
    if fields.finite != 1.0:
        scores = culprit()
        decision_head.check(scores.hidden, scores.log_q, scores.n_tokens)  # names the culprit
        raise ValueError("non-finite scores from the backend's device")
    return Decided(int(fields.chosen), fields.log_p[:count].copy(), fields.prior[:count].copy(),
                   fields.concept_term[:count].copy())


#: The structure of each program's results after the KV buffer (the executable store rebuilds them).
OUTPUTS = {"stream": StreamOutput, "score": ScoreOutput, "decide": DecideOutput, "rows": ScoreOutput}

__all__ = ["CountInputs", "DecideInputs", "DecideOutput", "DecisionFields", "OUTPUTS", "RowsInputs", "ScoreInputs", "ScoreOutput",
           "Sizes", "StreamInputs", "StreamOutput", "pack", "pack_decision", "read_decision", "unpack"]
