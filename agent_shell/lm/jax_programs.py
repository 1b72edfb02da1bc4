"""The JAX backend's compiled programs: one store per decoder, shared by every view of it.

Every pass runs a ``jax.jit`` program of the decoder's state (its weights) and arrays of bucketed
shapes (:mod:`agent_shell.lm.buckets`); :attr:`Programs.compiled` records every (program, shapes)
met, i.e. every program compiled or loaded by this process. With
:func:`cb_core.cache.enable_persistent_cache` on, programs go through
:func:`cb_core.cache.call_compiled` (stored, digest-checked executables) and a new process loads
them instead of compiling.

A pass's integer inputs (tokens, positions, where the buffer is filled, the head rows, the token
pairs, the candidates' rows and counts) are a named record of the program's kind, laid out in ONE
int32 array and read back inside the program by :mod:`agent_shell.lm.records` (its field sizes
follow from the pass's static :class:`agent_shell.lm.buckets.Sizes`), and its mask travels in a
second one: two copies to the device a pass. The programs:

* ``stream``: a pass over a stream's buffer (a prefill chunk, a draft to verify): the LM head's
  input, greedy's token and the wanted log-probabilities at its head rows;
* ``score``: the candidates' pass (the context's new tokens, then the prefix tree) with each
  candidate's log q summed and its hidden state gathered (:func:`gather`, the one gather of the
  JAX backend), padded to M_pad candidates; the captured inner layers beside them;
* ``decide``: the same pass and gather, then the decision head's kernel handed in by the caller (a
  static argument: :class:`agent_shell.lm.protocol.DecisionHead`; a concept's is cb_core's) and its
  record packed for one fetch (:func:`agent_shell.lm.records.pack_decision`): a decision is one
  program;
* ``rows``: the batched layout's right-padded rows over one context buffer, gathered alike;
* ``sample``: one sampled token per row over a shared prompt buffer; ``grow``: a bigger buffer.

Must not import the agents, the environments or torch.
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agent_shell.lm.buckets import Sizes, padded, pass_sizes
from agent_shell.lm.jax_mesh import Placement
from agent_shell.lm.jax_model import KV, Decoder
from agent_shell.lm.faults import is_out_of_memory, pass_fault
from agent_shell.lm.protocol import BackboneFault, DecisionHead
from agent_shell.lm.records import (OUTPUTS, DecideInputs, DecideOutput, RowsInputs, ScoreInputs, ScoreOutput,
                                    StreamInputs, StreamOutput, pack, pack_decision, unpack)


#: A program's argument after the decoder's state: a device array, a host array or scalar, or a KV buffer.
Operand = Union[jax.Array, np.ndarray, np.generic, KV]
#: A program's results: the new KV buffer alone (``grow``), or it and the program's named outputs.
Results = Union[KV, tuple[KV, Union[StreamOutput, ScoreOutput, DecideOutput]], tuple[KV, jax.Array]]


@dataclass(frozen=True)
class CandidateSlots:
    """The candidates of a candidates' pass (padded to the pass's ``m`` slots,
    :func:`agent_shell.lm.buckets.pass_sizes`): each token pair's candidate (``owner``), each
    candidate's final head row (``final``) and, for a decision, each candidate's token count
    (``n_tokens``)."""

    owner: Sequence[int]
    final: Sequence[int]
    n_tokens: Sequence[int] = ()


@dataclass(frozen=True)
class Pass:
    """One pass's inputs before padding: ``tokens`` at ``positions``, written after the ``at`` tokens
    the stream holds; ``allowed`` [n, n] which of them each one sees; the LM head at ``head``
    (indices into the tokens); the (head row, target token) pairs whose log-probabilities are
    wanted; the token indices whose inner states are captured, and at which layers (0..L).

    Its records (:mod:`agent_shell.lm.records`), padded to :func:`agent_shell.lm.buckets.pass_sizes`:
    :meth:`stream_inputs` (a stream pass), :meth:`score_inputs` and :meth:`decide_inputs` (a candidates' pass)."""

    tokens: list[int]
    positions: list[int]
    at: int
    allowed: np.ndarray
    head: list[int]
    pairs: tuple[list[int], list[int]] = ([], [])
    capture: list[int] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)

    def _padded(self, candidates: bool = False) -> tuple[Sizes, np.ndarray, dict]:
        """(the sizes, the bool mask [t, t], the padded fields every record shares): padding tokens
        see themselves only."""
        n = len(self.tokens)
        sizes = pass_sizes(n, len(self.head), len(self.pairs[0]), len(self.capture), len(self.layers), candidates)
        t, k, p = sizes.t, sizes.k, sizes.p
        mask = np.zeros((t, t), bool)
        mask[:n, :n] = self.allowed
        mask[np.arange(n, t), np.arange(n, t)] = True
        common = dict(tokens=padded(self.tokens, t),
                      positions=padded(self.positions, t, self.positions[-1] if self.positions else 0),
                      at=self.at, head=padded(self.head, k), pair_row=padded(self.pairs[0], p),
                      pair_target=padded(self.pairs[1], p))
        return sizes, mask, common

    def stream_inputs(self) -> tuple[Sizes, np.ndarray, np.ndarray]:
        """(the sizes, the int32 inputs of :class:`StreamInputs` packed, the mask)."""
        sizes, mask, common = self._padded()
        record = StreamInputs(**common, capture=padded(self.capture, sizes.c), layers=self.layers)
        return sizes, pack(record, sizes), mask

    def score_inputs(self, slots: CandidateSlots) -> tuple[Sizes, np.ndarray, np.ndarray]:
        """:meth:`stream_inputs`'s, for a candidates' pass over ``slots`` (:class:`ScoreInputs`): padded
        pairs belong to candidate ``m`` (dropped)."""
        sizes, mask, common = self._padded(True)
        record = ScoreInputs(**common, capture=padded(self.capture, sizes.c), layers=self.layers,
                             owner=padded(slots.owner, sizes.p, fill=sizes.m), final=padded(slots.final, sizes.m))
        return sizes, pack(record, sizes), mask

    def decide_inputs(self, slots: CandidateSlots) -> tuple[Sizes, np.ndarray, np.ndarray]:
        """:meth:`score_inputs`'s, for a decision (:class:`DecideInputs`, no captures): padded candidates
        count one token."""
        sizes, mask, common = self._padded(True)
        record = DecideInputs(**common, owner=padded(slots.owner, sizes.p, fill=sizes.m),
                              final=padded(slots.final, sizes.m), n_tokens=padded(slots.n_tokens, sizes.m, fill=1),
                              count=len(slots.final))
        return sizes, pack(record, sizes), mask


def _outputs(model: Decoder, x: jax.Array, head: jax.Array, pair_row: jax.Array, pair_target: jax.Array):
    """(hidden [K, D] float32, greedy [K], token log-probs [P]) at the head rows of x [N, D]."""
    normed, logits = model.head(x[head])
    top = logits.max(-1, keepdims=True)
    log_norm = top[:, 0] + jnp.log(jnp.exp(logits - top).sum(-1))
    token_lp = logits[pair_row, pair_target] - log_norm[pair_row]
    return normed.astype(jnp.float32), jnp.argmax(logits, -1).astype(jnp.int32), token_lp


def gather(token_lp: jax.Array, hidden: jax.Array, owner: jax.Array, final_rows: jax.Array) -> tuple[jax.Array,
                                                                                                    jax.Array]:
    """(log q [M_pad] float32, hidden [M_pad, D]) of a scoring pass's outputs, on the device: each
    candidate's token log-probabilities summed (pairs of ``owner`` M_pad are padding) and the LM
    head input at its final action token (``final_rows`` [M_pad])."""
    m_pad = final_rows.shape[0]
    log_q = jax.ops.segment_sum(token_lp, owner, num_segments=m_pad + 1)[:m_pad]
    return log_q, hidden[final_rows]


def _source_digest() -> str:
    """SHA-256 of the modules whose code the programs trace: part of every stored program's name (a
    decision head's code is named by its kernel's ``repr``, a static argument)."""
    digest = hashlib.sha256()
    for module in ("jax_programs.py", "jax_model.py", "records.py"):
        digest.update(Path(__file__).with_name(module).read_bytes())
    return digest.hexdigest()[:16]


def _example(name: str) -> Any:
    """The structure of program ``name``'s results (the executable store rebuilds them from it)."""
    if name == "grow":
        return KV(0, 0)
    if name == "sample":
        return (KV(0, 0), 0)
    kind = OUTPUTS[name]
    return (KV(0, 0), kind(*[0] * len(kind._fields)))


class Programs:
    """The compiled passes of one decoder, shared by every view (fork) of it."""

    _of: "weakref.WeakKeyDictionary[Decoder, Programs]" = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, decoder: Decoder) -> "Programs":
        """The programs of ``decoder`` (made once per decoder: every backend on it shares them)."""
        if decoder not in cls._of:
            cls._of[decoder] = cls(decoder)
        return cls._of[decoder]

    def __init__(self, decoder: Decoder):
        self.config = decoder.config
        self.dtype = decoder.dtype
        self.placement = Placement(decoder.embed[...].sharding.mesh)
        self.graphdef, self.state = nnx.split(decoder)
        self.compiled: dict[tuple, int] = {}
        self._name = f"lm-{self.config.model_type}-" + hashlib.sha256(
            (repr(self.config) + str(self.dtype) + _source_digest()).encode()).hexdigest()[:16]
        graphdef = self.graphdef

        def forward(state, kv, x: StreamInputs | ScoreInputs | DecideInputs, mask, capture):
            model = nnx.merge(graphdef, state)
            h, kv, captured = model(x.tokens[None], x.positions[None], kv, x.at, mask[None], capture=capture)
            return model, kv, _outputs(model, h[0], x.head, x.pair_row, x.pair_target), captured

        def stream(sizes, state, kv, ints, mask):
            x = unpack(StreamInputs, sizes, ints)
            _, kv, outs, captured = forward(state, kv, x, mask, x.capture)
            return kv, StreamOutput(*outs, captured[x.layers])

        def score(sizes, state, kv, ints, mask):
            x = unpack(ScoreInputs, sizes, ints)
            _, kv, (hidden, _, token_lp), captured = forward(state, kv, x, mask, x.capture)
            return kv, ScoreOutput(*gather(token_lp, hidden, x.owner, x.final), captured[x.layers])

        def decide(sizes, kernel, state, kv, ints, mask, parameters):
            x = unpack(DecideInputs, sizes, ints)
            _, kv, (hidden, _, token_lp), _ = forward(state, kv, x, mask, None)
            log_q, features = gather(token_lp, hidden, x.owner, x.final)
            return kv, DecideOutput(pack_decision(kernel(parameters, features, log_q, x.n_tokens, x.count)), log_q,
                                    features)

        def rows(sizes, state, kv, shared, ints):
            x = unpack(RowsInputs, sizes, ints)
            n_rows, width = x.ids.shape
            model = nnx.merge(graphdef, state)
            positions = x.shared_len + jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (n_rows, width))
            h, kv, captured = model(x.ids, positions, kv, jnp.int32(0), jnp.tril(jnp.ones((1, width, width), bool)),
                                    shared=shared, shared_len=x.shared_len, capture=x.capture)
            hidden, _, token_lp = _outputs(model, h.reshape(-1, h.shape[-1]), x.head, x.pair_row, x.pair_target)
            return kv, ScoreOutput(*gather(token_lp, hidden, x.owner, x.final), captured[x.layers])

        def sample(state, kv, shared, shared_len, ids, positions, at, key, step, temperature):
            model = nnx.merge(graphdef, state)
            x, kv, _ = model(ids, positions, kv, at, jnp.ones((1, 1, 1), bool), shared=shared, shared_len=shared_len)
            _, logits = model.head(x[:, -1])
            drawn = jax.random.categorical(jax.random.fold_in(key, step), logits / temperature, axis=-1)
            return kv, drawn.astype(jnp.int32)

        def grow(state, kv, slots):
            pad = [(0, 0)] * 3 + [(0, slots.shape[0] - kv.keys.shape[3]), (0, 0)]
            return KV(jnp.pad(kv.keys, pad), jnp.pad(kv.values, pad))

        # the KV buffers come back split on their heads, everything else replicated (one record fetched)
        kv, whole = self.placement.kv, self.placement.replicated
        out = (KV(kv, kv), whole)
        self._jitted = {name: jax.jit(fn, static_argnums=0, donate_argnums=2, out_shardings=out)
                        for name, fn in (("stream", stream), ("score", score), ("rows", rows))}
        self._jitted.update(decide=jax.jit(decide, static_argnums=(0, 1), donate_argnums=3, out_shardings=out),
                            sample=jax.jit(sample, donate_argnums=1, out_shardings=out),
                            grow=jax.jit(grow, out_shardings=KV(kv, kv)))

    def run(self, name: str, static: tuple, *args: Operand) -> Results:
        """Program ``name`` with its ``static`` arguments (``(sizes,)``; ``(sizes, kernel)`` for
        ``decide``; ``()`` for ``sample`` and ``grow``) on ``args`` (after the state), recording its
        shapes; through the executable store when one is enabled.

        Raises:
            agent_shell.lm.protocol.BackboneFault: the pass cannot be traced for these weights
                (shapes that do not fit): every later call would fail alike.
        """
        from cb_core.cache import call_compiled

        shapes = tuple((tuple(np.shape(a)), str(getattr(a, "dtype", ""))) for a in jax.tree.leaves(args))
        key = (name, static[0] if static else (), shapes)
        self.compiled[key] = self.compiled.get(key, 0) + 1
        try:
            return call_compiled(f"{self._name}-{name}", self._jitted[name], static, (self.state, *args),
                                 _example(name))
        except (TypeError, ValueError, IndexError) as err:  # raised while tracing: the same shapes fail again
            raise BackboneFault.of(err, f"the JAX decoder's {name} pass") from err
        except RuntimeError as err:  # XLA's RESOURCE_EXHAUSTED: this context is too large for the memory
            if not is_out_of_memory(err):
                raise
            raise pass_fault(err, f"the JAX decoder's {name} pass", _context_tokens(name, static, args)) from err

    def parameters(self, decision_head: DecisionHead, width: int) -> Any:
        """``decision_head``'s parameters on this decoder's devices (replicated).

        Raises:
            ValueError: ``width`` differs from the head's.
        """
        from agent_shell.lm.decision import check_width

        check_width(decision_head, width)
        return decision_head.parameters(self.placement.replicated)


def _context_tokens(name: str, static: tuple, args: tuple) -> int | None:
    """The context a stream, score or decide pass was asked to hold: its last token's position + 1
    (read from its named inputs); None for another pass."""
    kinds = {"stream": StreamInputs, "score": ScoreInputs, "decide": DecideInputs}
    if name not in kinds or not static or len(args) < 2 or not isinstance(args[1], np.ndarray):
        return None
    return int(np.max(unpack(kinds[name], static[0], args[1]).positions)) + 1


__all__ = ["CandidateSlots", "Operand", "Pass", "Programs", "Results", "gather"]
