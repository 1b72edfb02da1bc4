"""A decision of Eq. 3 taken where its scores lie, and fetched to the host once.

The decision is a head handed to the backend (:class:`agent_shell.lm.protocol.DecisionHead`: a
traceable kernel and its parameters; a concept's is :attr:`cb_core.Concept.decision_head`).
:func:`decide` is the one entry: a backend that decides on its device (``decide``, the PyTorch and
JAX backends) runs the head inside its own program; any other backend's scores are decided here
(:func:`decide_scores`: the head's kernel in one compiled call where the scores lie, its fields
packed into one float32 array, :func:`agent_shell.lm.records.pack_decision`, the one array fetched
to the host after the argmax and read by :func:`agent_shell.lm.records.read_decision`). The
PyTorch backend hands its scores to this path through DLPack (:func:`as_jax`).

Imports JAX only when a decision is taken; nothing of cb_core; must not import the agents, the
environments or torch.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from agent_shell.lm.protocol import Context, DecisionHead, LanguageModel
from agent_shell.lm.buckets import Sizes
from agent_shell.lm.records import CountInputs, pack, pack_decision, read_decision, unpack
from agent_shell.lm.scores import Decided, DeviceScores, fetch

if TYPE_CHECKING:
    import jax
    import torch


def decide(lm: LanguageModel, context: Context, candidates: Sequence[str], action_prefix: str,
           decision_head: DecisionHead) -> Decided:
    """The decision among ``candidates`` under ``decision_head`` (seed Eq. 3 and Eq. 7 for a
    concept's head): the backend's own ``decide`` when it has one (on its device: one fetch, after
    the argmax), else :meth:`LanguageModel.score`'s numbers decided by :func:`decide_scores`.

    Raises:
        ValueError: what ``score`` raises; a head whose width is not the backend's hidden size;
            non-finite scores (naming the candidate).
    """
    fused = getattr(lm, "decide", None)
    if callable(fused):
        return fused(context, candidates, action_prefix, decision_head)
    return decide_scores(decision_head, DeviceScores.from_host(lm.score(context, candidates, action_prefix)))


def check_width(decision_head: DecisionHead, width: int) -> None:
    """Raises ValueError when features of ``width`` columns are not what ``decision_head`` reads."""
    if width != decision_head.width:
        raise ValueError(f"features of width {width} differ from the decision head's width d = {decision_head.width}")


@functools.cache
def _program(kernel: Any) -> Callable:
    import jax

    def run(sizes, parameters, hidden, log_q, ints):
        counts = unpack(CountInputs, sizes, ints)
        return pack_decision(kernel(parameters, hidden, log_q, counts.n_tokens, counts.count))

    return jax.jit(run, static_argnums=0)


def decide_scores(decision_head: DecisionHead, scores: DeviceScores) -> Decided:
    """The decision under ``decision_head`` on padded ``scores`` (features = ``scores.hidden``),
    computed where they lie: one compiled call, one array fetched.

    Raises:
        ValueError: features whose width differs from the head's; non-finite scores (naming the
            candidate).
    """
    check_width(decision_head, int(scores.hidden.shape[1]))
    # where the scores lie: a device, or a mesh's devices (a sharding); None: JAX's default device
    parameters = decision_head.parameters(getattr(scores.hidden, "sharding", None))
    sizes = Sizes(0, 0, 0, m=int(scores.hidden.shape[0]))
    ints = pack(CountInputs(scores.n_tokens, scores.count), sizes)
    record = _program(decision_head.kernel)(sizes, parameters, scores.hidden, scores.log_q, ints)
    return read_decision(fetch(record), scores.count, scores.fetched, decision_head)


def as_jax(array: torch.Tensor | np.ndarray) -> jax.Array | np.ndarray:
    """A torch tensor as a JAX array on the matching device without a copy (DLPack), a numpy array as
    it is; a tensor on a device JAX does not see here comes to the host first. A tensor that
    requires grad is detached (DLPack refuses it) and a strided one made contiguous (a copy) first;
    bfloat16 stays bfloat16 (through the host: ml_dtypes' bfloat16, bit for bit)."""
    import jax

    if isinstance(array, np.ndarray):
        return array
    array = array.detach()
    if not array.is_contiguous():
        array = array.contiguous()
    try:
        return jax.dlpack.from_dlpack(array)
    except (RuntimeError, TypeError, ValueError, BufferError):  # no JAX device of its kind: through the host
        host = array.cpu()
        if str(host.dtype) == "torch.bfloat16":  # numpy has no bfloat16: the same bits, as ml_dtypes'
            import ml_dtypes
            import torch

            return host.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return host.numpy()


__all__ = ["as_jax", "check_width", "decide", "decide_scores"]
