"""The sizes a backend's passes are rounded up to, so that a step's shapes repeat: one rule.

Every size of a pass follows from ONE size, its tokens' ``t``. A candidates' pass (the context's new
tokens, at most :data:`STREAM_CHUNK`, and the candidates' prefix tree) has ``t`` = a power of two,
at least :data:`STREAM_CHUNK`, runs the LM head at all ``t`` rows and has room for
:data:`PAIRS_PER_TOKEN` token pairs a token and ``t`` candidate slots (a candidate owns at least one
token of the pass). A stream pass is a prefill chunk of :data:`STREAM_CHUNK` tokens (the head at
its last row) or, up to :data:`LEAST` tokens, a token to decode or a draft to verify (the head at
every row). So the programs an episode meets are two stream programs and a candidates' program per
power of two its steps reach, at its KV buffers' :func:`capacity`, not a product of four bucketed
sizes; a candidate set decided apart from a pass has :func:`slots` slots, the same rule. A compiled
program (the JAX backend, :mod:`agent_shell.lm.jax_programs`) serves every pass of its sizes, and
an episode stops meeting new shapes after its first steps (``benchmarks/episode_compiles.py``
counts them). Backend-neutral (numpy only).

Must not import the agents, the environments, torch or JAX.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

#: The fewest tokens (rows, candidate slots) a pass is padded to: a decoded token, a draft to verify.
LEAST = 16
#: The tokens of a prefill chunk, and the fewest of a candidates' pass (whose leading context tokens
#: are at most this many: the rest are encoded in chunks before it).
STREAM_CHUNK = 128
#: Token pairs a candidates' pass has room for, per token (more pairs raise its token bucket).
PAIRS_PER_TOKEN = 4
#: The fewest slots a stream's KV buffer holds (buffers grow by doubling). Attention reads only a
#: buffer's filled slots, so a roomy buffer costs memory (about 189 MB for the default backbone in
#: float32), not time, and an episode's growing context crosses no capacity (each one a new set of
#: programs) before 4,096 tokens.
MIN_CAPACITY = 4096


class Sizes(NamedTuple):
    """A pass's static sizes (all padded): ``t`` tokens (for the batched rows, (rows, width)),
    ``k`` LM-head rows, ``p`` token pairs, ``c`` captured tokens at ``l`` layers, ``m`` candidate
    slots (M_pad; 0 for a stream pass)."""

    t: int | tuple[int, int]
    k: int
    p: int
    c: int = 0
    l: int = 0
    m: int = 0


def bucket(n: int, least: int = LEAST) -> int:
    """The size ``n`` (>= 0) items are padded to: the smallest power of two >= max(n, ``least``)
    (at most half is padding)."""
    return max(least, 1 << max(int(n) - 1, 0).bit_length())


def slots(m: int) -> int:
    """The candidate slots (M_pad) of a set of ``m`` candidates decided apart from a pass
    (:class:`agent_shell.lm.scores.DeviceScores`): :func:`bucket` of ``m``."""
    return bucket(m)


def pass_sizes(n: int, n_head: int, n_pairs: int, n_capture: int = 0, n_layers: int = 0,
               candidates: bool = False) -> Sizes:
    """The padded sizes of a pass over ``n`` tokens with ``n_head`` LM-head rows, ``n_pairs`` token
    pairs and ``n_capture`` captured tokens at ``n_layers`` layers, all from its tokens' ``t``: for
    a candidates' pass, :func:`bucket` (at least :data:`STREAM_CHUNK`) of the tokens, raised until
    the pairs fit :data:`PAIRS_PER_TOKEN` a token, with ``k`` = ``m`` = ``t`` and ``p`` =
    PAIRS_PER_TOKEN ``t``; for a stream pass, :data:`LEAST` (``k`` = ``t``) up to LEAST tokens, else
    whole :data:`STREAM_CHUNK` chunks (``k`` = 1 for a head at one row); ``c`` = ``t`` when tokens
    are captured."""
    if candidates:
        t = bucket(max(n, -(-n_pairs // PAIRS_PER_TOKEN)), STREAM_CHUNK)
        return Sizes(t, t, PAIRS_PER_TOKEN * t, t if n_capture else 0, n_layers, t)
    t = LEAST if n <= LEAST else STREAM_CHUNK * -(-n // STREAM_CHUNK)
    k = t if t == LEAST or n_head > 1 else 1
    return Sizes(t, k, bucket(n_pairs, 1) if n_pairs else 1, t if n_capture else 0, n_layers, 0)


def capacity(n: int, least: int = MIN_CAPACITY) -> int:
    """The slots of a KV buffer holding ``n`` tokens: a power of two, at least ``least``."""
    return max(least, 1 << max(n - 1, 0).bit_length())


def padded(values: Sequence[int], size: int, fill: int = 0) -> np.ndarray:
    """int32 [size]: ``values`` then ``fill``."""
    out = np.full(size, fill, np.int32)
    out[:len(values)] = values
    return out


__all__ = ["LEAST", "MIN_CAPACITY", "PAIRS_PER_TOKEN", "STREAM_CHUNK", "Sizes", "bucket", "capacity", "padded", "pass_sizes", "slots"]
