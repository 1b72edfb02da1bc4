"""The JAX backend's KV caches: one buffer per stream, updated in place by the passes.

A stream's keys and values live in one buffer ([L, 1, Hkv, C, hd] keys and values, C a power of
two, :func:`agent_shell.lm.buckets.capacity`) that a pass updates in place (the buffer is donated
to the compiled pass); pinned heads keep the buffer they were taken from, and a stream that starts
from a head copies it before its first write. :class:`JaxKV` is the
:class:`agent_shell.lm.kv_cache.CacheOps` of these buffers, so the prefix cache's bookkeeping
(:class:`~agent_shell.lm.kv_cache.PrefixCache`) is the PyTorch backend's own.

Must not import the agents, the environments or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agent_shell.lm.buckets import STREAM_CHUNK, capacity
from agent_shell.lm.jax_model import KV

if TYPE_CHECKING:
    from agent_shell.lm.jax_programs import Programs
    from agent_shell.lm.records import StreamOutput
    from agent_shell.lm.kv_cache import Forward


@dataclass
class StreamKV:
    """A stream's KV buffer (batch 1, [L, 1, Hkv, C, hd] keys and values, or None before the first
    pass) and how many of its slots hold the stream's tokens. ``owned``: no pinned head shares the
    buffer, so a pass may update it in place."""

    kv: KV | None = None
    length: int = 0
    owned: bool = True


class JaxKV:
    """:class:`agent_shell.lm.kv_cache.CacheOps` of :class:`StreamKV` buffers (``CacheOps[StreamKV,
    tuple[KV | None, int], StreamOutput]``) for one decoder's ``programs`` (every layer is full
    attention: a cache is cut back by its length alone), and the buffers a pass writes into."""

    chunk = STREAM_CHUNK  # a prefill chunk: one stream program, whatever the prompt

    def __init__(self, programs: Programs):
        self.programs = programs

    def new(self) -> StreamKV:
        return StreamKV()

    def snapshot(self, cache: StreamKV) -> tuple[KV | None, int]:
        cache.owned = False  # the snapshot keeps the buffer: later passes write into a copy
        return cache.kv, cache.length

    def from_snapshot(self, saved: tuple[KV | None, int], length: int) -> StreamKV:
        return StreamKV(saved[0], min(length, saved[1]), owned=False)

    def cut(self, cache: StreamKV, length: int) -> None:
        cache.length = min(cache.length, length)

    def truncatable(self, cache: StreamKV) -> bool:
        return True

    def encode(self, forward: Forward[StreamOutput], cache: StreamKV, ids: Sequence[int], start: int) -> StreamOutput:
        return forward(ids, cache, start)

    def buffer(self, batch: int, slots: int) -> KV:
        """An empty KV buffer: keys and values [L, batch, Hkv, slots, hd] in the model's dtype."""
        c = self.programs.config
        shape = (c.num_layers, batch, c.num_kv_heads, slots, c.head_dim)
        split = self.programs.placement.kv  # on the devices of the heads they hold
        return KV(jnp.zeros(shape, self.programs.dtype, device=split), jnp.zeros(shape, self.programs.dtype, device=split))

    def writable(self, cache: StreamKV, need: int) -> KV:
        """``cache``'s buffer, holding at least ``need`` slots, that a pass may update in place
        (grown, or copied when a pinned head shares it)."""
        if cache.kv is None:
            return self.buffer(1, capacity(need))
        slots = cache.kv.keys.shape[3]
        if need > slots:
            return self.programs.run("grow", (), cache.kv, np.zeros(capacity(need), np.int8))
        if not cache.owned:  # a copy on the device (a transfer, not a compiled program)
            return KV(*(jax.device_put(x, self.programs.placement.kv, may_alias=False)
                        for x in (cache.kv.keys, cache.kv.values)))
        return cache.kv


__all__ = ["JaxKV", "StreamKV"]
