"""The JAX backend's compiled programs: one store per decoder, shared by every view of it.

Every pass runs a ``jax.jit`` program of the decoder's state (its weights) and arrays of bucketed
shapes (:mod:`agent_shell.lm.buckets`); :attr:`Programs.compiled` records every (program, shapes)
met, i.e. every program compiled or loaded by this process. With
:func:`cb_core.cache.enable_persistent_cache` on, programs go through
:func:`cb_core.cache.call_compiled` (stored, digest-checked executables) and a new process loads
them instead of compiling.

A pass's integer inputs (tokens, positions, where the buffer is filled, the head rows, the token
pairs, the candidates' rows and counts) travel in ONE int32 array, split inside the program at
sizes that are part of its static shape (:class:`Shape`), and its mask in a second one: two copies
to the device a pass. The programs:

* ``stream``: a pass over a stream's buffer (a prefill chunk, a draft to verify): the LM head's
  input, greedy's token and the wanted log-probabilities at its head rows;
* ``score``: the candidates' pass (the context's new tokens, then the prefix tree) with each
  candidate's log q summed and its hidden state gathered (:func:`gather`, the one gather of the
  JAX backend), padded to M_pad candidates; the captured inner layers beside them;
* ``decide``: the same pass and gather, then the concept's decision (cb_core's kernel,
  :data:`cb_core.model.decide_padded`) and its record packed for one fetch
  (:func:`agent_shell.lm.decision.packed`): a decision is one program;
* ``rows``: the batched layout's right-padded rows over one context buffer, gathered alike;
* ``sample``: one sampled token per row over a shared prompt buffer; ``grow``: a bigger buffer.

Must not import the agents, the environments or torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, NamedTuple, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agent_shell.lm.buckets import bucket, padded
from agent_shell.lm.jax_model import KV, Decoder
from agent_shell.lm.faults import is_out_of_memory, pass_fault
from agent_shell.lm.protocol import BackboneFault

if TYPE_CHECKING:
    from cb_core import Concept


#: A program's argument after the decoder's state: a device array, a host array or scalar, or a KV buffer.
Operand = Union[jax.Array, np.ndarray, np.generic, KV]
#: A program's results: the new KV buffer alone (``grow``), or it and the program's arrays.
Results = Union[KV, tuple[Union[KV, jax.Array, None], ...]]


class Shape(NamedTuple):
    """A pass's static sizes: ``t`` tokens, ``k`` head rows, ``p`` token pairs, ``c`` captured
    tokens at ``l`` layers, ``m`` candidate slots (M_pad; 0 for a stream pass)."""

    t: int
    k: int
    p: int
    c: int = 0
    l: int = 0
    m: int = 0


@dataclass(frozen=True)
class Pass:
    """One stream pass's inputs before padding: ``tokens`` at ``positions``, written after the
    ``at`` tokens the stream holds; ``allowed`` [n, n] which of them each one sees; the LM head
    at ``head`` (indices into the tokens); the (head row, target token) pairs whose
    log-probabilities are wanted; the token indices whose inner states are captured, and at
    which layers (0..L).

    A candidates' pass also names its ``m`` candidate slots (M_pad): each pair's candidate
    (``owner``) and each candidate's final head row (``final``), and for a decision each
    candidate's token count (``n_tokens``) and the ``concept`` (its device vector,
    :meth:`Programs.concept`). Its :attr:`program` follows."""

    tokens: list[int]
    positions: list[int]
    at: int
    allowed: np.ndarray
    head: list[int]
    pairs: tuple[list[int], list[int]] = ([], [])
    capture: list[int] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)
    m: int = 0
    owner: Sequence[int] = ()
    final: Sequence[int] = ()
    n_tokens: Sequence[int] = ()
    concept: jax.Array | None = None

    @property
    def program(self) -> str:
        """``decide`` (a concept given), ``score`` (candidates given) or ``stream``."""
        return "decide" if self.concept is not None else "score" if self.m else "stream"

    def arrays(self) -> tuple[Shape, np.ndarray, np.ndarray]:
        """(the static shape, the int32 inputs in one array, the bool mask [t, t]), padded to buckets:
        padding tokens see themselves only, padded pairs belong to candidate ``m`` (dropped), padded
        candidates count one token."""
        n = len(self.tokens)
        t, k, p = bucket(n), bucket(len(self.head)), bucket(len(self.pairs[0]))  # the head runs at k rows only
        c = bucket(len(self.capture)) if self.capture else 0
        mask = np.zeros((t, t), bool)
        mask[:n, :n] = self.allowed
        mask[np.arange(n, t), np.arange(n, t)] = True
        parts = [padded(self.tokens, t), padded(self.positions, t, self.positions[-1] if self.positions else 0),
                 np.int32([self.at]), padded(self.head, k), padded(self.pairs[0], p), padded(self.pairs[1], p)]
        decides = self.concept is not None
        if not decides:
            parts += [padded(self.capture, c), np.asarray(self.layers, np.int32)]
        if self.m:
            parts += [padded(self.owner, p, fill=self.m), padded(self.final, self.m)]
        if decides:
            parts += [padded(self.n_tokens, self.m, fill=1), np.int32([len(self.final)])]
        return Shape(t, k, p, c, len(self.layers), self.m), np.concatenate(parts), mask


@dataclass
class PassOutput:
    """A stream pass's outputs (device arrays, fetched on demand): the head rows' hidden states
    (float32 [K, D], the LM head's input), greedy's token after each head row [K], the token
    pairs' log-probabilities float32 [P] and the captured layers' states float32 [NL, R, D]."""

    hidden: jax.Array
    greedy: jax.Array
    token_lp: jax.Array
    captured: jax.Array

    def first_greedy(self) -> int:
        """Greedy's token after the first head row (a prefill chunk's last token)."""
        return int(np.asarray(self.greedy)[0])


def _split(ints: jax.Array, sizes: Sequence[int]) -> list[jax.Array]:
    out, at = [], 0
    for size in sizes:
        out.append(ints[at:at + size])
        at += size
    return out


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
    """SHA-256 of the modules whose code the programs trace: part of every stored program's name."""
    digest = hashlib.sha256()
    for module in ("jax_programs.py", "jax_model.py", "decision.py"):
        digest.update(Path(__file__).with_name(module).read_bytes())
    return digest.hexdigest()[:16]


#: The output structure of each program (the persistent store rebuilds its results from it).
_EXAMPLES = {"stream": (KV(0, 0), 0, 0, 0, 0), "score": (KV(0, 0), 0, 0, 0), "decide": (KV(0, 0), 0, 0, 0),
             "rows": (KV(0, 0), 0, 0, 0), "sample": (KV(0, 0), 0), "grow": KV(0, 0)}


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
        from agent_shell.lm.decision import decision, packed

        self.config = decoder.config
        self.dtype = decoder.dtype
        self.device: jax.Device = next(iter(decoder.embed[...].devices()))
        self.graphdef, self.state = nnx.split(decoder)
        self.compiled: dict[tuple, int] = {}
        self._name = f"lm-{self.config.model_type}-" + hashlib.sha256(
            (repr(self.config) + str(self.dtype) + _source_digest()).encode()).hexdigest()[:16]
        graphdef = self.graphdef

        def candidates_pass(shape, state, kv, ints, mask, capture: bool):
            t, k, p, c, n_layers, m = shape
            parts = _split(ints, (t, t, 1, k, p, p) + ((c, n_layers) if capture else ()) + ((p, m) if m else ()))
            tokens, positions, at, head, pair_row, pair_target = parts[:6]
            model = nnx.merge(graphdef, state)
            x, kv, captured = model(tokens[None], positions[None], kv, at[0], mask[None],
                                    capture=parts[6] if capture else None)
            hidden, greedy, token_lp = _outputs(model, x[0], head, pair_row, pair_target)
            return model, kv, (hidden, greedy, token_lp), parts, (captured[parts[7]] if capture else None)

        def stream(shape, state, kv, ints, mask):
            _, kv, outs, _, captured = candidates_pass(shape, state, kv, ints, mask, True)
            return (kv, *outs, captured)

        def score(shape, state, kv, ints, mask):
            _, kv, (hidden, _, token_lp), parts, captured = candidates_pass(shape, state, kv, ints, mask, True)
            return (kv, *gather(token_lp, hidden, parts[8], parts[9]), captured)

        def decide(shape, state, kv, ints, mask, concept):
            _, kv, (hidden, _, token_lp), parts, _ = candidates_pass(shape, state, kv, ints[:-shape.m - 1], mask,
                                                                    False)
            log_q, features = gather(token_lp, hidden, parts[6], parts[7])
            return kv, packed(decision(concept, features, log_q, ints[-shape.m - 1:])), log_q, features

        def rows(shape, state, kv, shared, ints):
            (n_rows, width), k, p, c, n_layers, m = shape
            ids, shared_len, head, pair_row, pair_target, owner, final, capture, layers = _split(
                ints, (n_rows * width, 1, k, p, p, p, m, c, n_layers))
            model = nnx.merge(graphdef, state)
            positions = shared_len[0] + jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (n_rows, width))
            x, kv, captured = model(ids.reshape(n_rows, width), positions, kv, jnp.int32(0),
                                    jnp.tril(jnp.ones((1, width, width), bool)), shared=shared,
                                    shared_len=shared_len[0], capture=capture)
            hidden, _, token_lp = _outputs(model, x.reshape(-1, x.shape[-1]), head, pair_row, pair_target)
            return (kv, *gather(token_lp, hidden, owner, final), captured[layers])

        def sample(state, kv, shared, shared_len, ids, positions, at, key, step, temperature):
            model = nnx.merge(graphdef, state)
            x, kv, _ = model(ids, positions, kv, at, jnp.ones((1, 1, 1), bool), shared=shared, shared_len=shared_len)
            _, logits = model.head(x[:, -1])
            drawn = jax.random.categorical(jax.random.fold_in(key, step), logits / temperature, axis=-1)
            return kv, drawn.astype(jnp.int32)

        def grow(state, kv, slots):
            pad = [(0, 0)] * 3 + [(0, slots.shape[0] - kv.keys.shape[3]), (0, 0)]
            return KV(jnp.pad(kv.keys, pad), jnp.pad(kv.values, pad))

        self._jitted = {name: jax.jit(fn, static_argnums=0, donate_argnums=2)
                        for name, fn in (("stream", stream), ("score", score), ("decide", decide), ("rows", rows))}
        self._jitted.update(sample=jax.jit(sample, donate_argnums=1), grow=jax.jit(grow))

    def run(self, name: str, shape: Shape | tuple[()], *args: Operand) -> Results:
        """Program ``name`` of static ``shape`` (``()`` for ``sample`` and ``grow``) on ``args`` (after
        the state), recording its shapes; through the executable store when one is enabled.

        Raises:
            agent_shell.lm.protocol.BackboneFault: the pass cannot be traced for these weights
                (shapes that do not fit): every later call would fail alike.
        """
        from cb_core.cache import call_compiled

        static = (shape,) if shape else ()
        shapes = tuple((tuple(np.shape(a)), str(getattr(a, "dtype", ""))) for a in jax.tree.leaves(args))
        key = (name, shape, shapes)
        self.compiled[key] = self.compiled.get(key, 0) + 1
        try:
            return call_compiled(f"{self._name}-{name}", self._jitted[name], static, (self.state, *args),
                                 _EXAMPLES[name])
        except (TypeError, ValueError, IndexError) as err:  # raised while tracing: the same shapes fail again
            raise BackboneFault.of(err, f"the JAX decoder's {name} pass") from err
        except RuntimeError as err:  # XLA's RESOURCE_EXHAUSTED: this context is too large for the memory
            if not is_out_of_memory(err):
                raise
            raise pass_fault(err, f"the JAX decoder's {name} pass", _context_tokens(name, shape, args)) from err

    def concept(self, concept: Concept, width: int) -> jax.Array:
        """:func:`agent_shell.lm.decision.concept_vector` on this decoder's device.

        Raises:
            ValueError: ``width`` differs from the concept's d.
        """
        from agent_shell.lm.decision import concept_vector

        return concept_vector(concept, width, self.device)


def _context_tokens(name: str, shape: Shape | tuple[()], args: tuple) -> int | None:
    """The context a stream, score or decide pass was asked to hold: its last token's position + 1
    (the positions follow the tokens in its int32 inputs, :meth:`Pass.arrays`); None for another pass."""
    ints = args[1] if name in ("stream", "score", "decide") and len(args) > 1 else None
    if not isinstance(shape, Shape) or not isinstance(ints, np.ndarray) or ints.size < 2 * shape.t:
        return None
    return int(ints[shape.t:2 * shape.t].max()) + 1


@contextlib.contextmanager
def host_fetches() -> Iterator[list[tuple[int, ...]]]:
    """Count the JAX arrays whose values reach the host while the context is open: a list that
    grows by the shape of each one (a diagnostic for measurements and tests, not for runs).

    Counted: every first read of an array's value (``int``, ``float``, ``.tolist()``,
    ``jax.device_get``, ...) and every ``np.asarray`` / ``np.array`` of a JAX array (on a CPU
    NumPy reads those through the buffer protocol, below any Python hook). Not thread-safe:
    it patches ``jax.Array``'s value and NumPy's two constructors for the duration.
    """
    from jax._src.array import ArrayImpl

    seen: list[tuple[int, ...]] = []
    value, asarray, array = ArrayImpl._value, np.asarray, np.array

    def read(self):
        if self._npy_value is None:
            seen.append(tuple(self.shape))
        return value.fget(self)

    def converting(make):
        def convert(obj, *args, **kwargs):
            if isinstance(obj, jax.Array):
                seen.append(tuple(obj.shape))
            return make(obj, *args, **kwargs)
        return convert

    ArrayImpl._value, np.asarray, np.array = property(read), converting(asarray), converting(array)
    try:
        yield seen
    finally:
        ArrayImpl._value, np.asarray, np.array = value, asarray, array


__all__ = ["Operand", "Pass", "PassOutput", "Programs", "Results", "Shape", "gather", "host_fetches"]
