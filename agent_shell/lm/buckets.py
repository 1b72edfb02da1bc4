"""The sizes a backend's passes are rounded up to, so that a step's shapes repeat.

A pass whose tokens, rows, head rows and token pairs are padded to :data:`BUCKETS` and whose KV
buffer holds :func:`capacity` slots has one of a bounded set of shapes: a compiled program (the
JAX backend, :mod:`agent_shell.lm.jax_programs`) serves every pass of its bucket, and an episode
stops meeting new shapes after its first steps. Backend-neutral (numpy only).

Must not import the agents, the environments, torch or JAX.
"""

from __future__ import annotations

import bisect
from typing import Sequence

import numpy as np

#: Sizes a pass's tokens, rows, head rows and token pairs are rounded up to: 1, 2, 4, 8, 16, 24, 32,
#: 48, ..., 384, 512 (powers of two and three times powers of two), then every multiple of 256: at
#: most a third is padding, and at most an eighth past 2,048 (a long context's first pass).
BUCKETS = tuple(sorted({1, 2, 4} | {2**k for k in range(3, 10)} | {3 * 2**k for k in range(3, 8)}
                       | {256 * k for k in range(2, 4097)}))
#: The fewest slots a stream's KV buffer holds (buffers grow by doubling). Attention reads only a
#: buffer's filled slots, so a roomy buffer costs memory (about 47 MB for the default backbone in
#: float32), not time, and an episode's growing context crosses fewer capacities (each a program).
MIN_CAPACITY = 1024


def bucket(n: int) -> int:
    """The smallest size in :data:`BUCKETS` that holds ``n`` (>= 1) items."""
    return int(BUCKETS[bisect.bisect_left(BUCKETS, max(n, 1))])


def capacity(n: int, least: int = MIN_CAPACITY) -> int:
    """The slots of a KV buffer holding ``n`` tokens: a power of two, at least ``least``."""
    return max(least, 1 << max(n - 1, 0).bit_length())


def padded(values: Sequence[int], size: int, fill: int = 0) -> np.ndarray:
    """int32 [size]: ``values`` then ``fill``."""
    out = np.full(size, fill, np.int32)
    out[:len(values)] = values
    return out


__all__ = ["BUCKETS", "MIN_CAPACITY", "bucket", "capacity", "padded"]
