"""The prefix KV cache: a context's keys and values, kept and reused by the next call.

A backend keeps the KV cache of the last context it encoded, with the token ids it covers. The
next call reuses the longest common token prefix and encodes only the rest, so an episode whose
context grows step by step encodes only its new tokens. Scoring and decoding extend the cache
temporarily and cut it back. One cache serves one stream of related contexts: a second stream
(scoring contexts beside routing prompts) needs a second cache, which a backend's ``fork`` gives.

*Pinned heads* (:class:`HeadStore`) outlive the stream: the fixed head of a prompt (the ReAct
header and the demonstrations of a task type) is encoded once, pinned, and every later context
that starts with it (every episode of that task type, whatever ran in between) starts from its
keys and values instead of re-encoding it. A prefill starts from whichever of the stream and
the pinned heads shares the longest token prefix with the new context. Forks share one store.

The bookkeeping (:class:`PrefixCache`, :class:`HeadStore`) is the same for every kind of cache
and knows none: what a cache is, what a snapshot of it keeps and how a pass writes into it is a
:class:`CacheOps` (:class:`agent_shell.lm.torch_kv.TransformersKV` for the PyTorch backend,
:class:`agent_shell.lm.jax_kv.JaxKV` for the JAX one), whose types the bookkeeping carries
through as type parameters.

Must not import the agents, the environments, torch or JAX.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, Protocol, Sequence, TypeVar, runtime_checkable

from agent_shell.lm.tokenization import common_prefix_len

#: Longest stretch of new context tokens encoded in one forward pass (bounds attention memory).
PREFILL_CHUNK = 2048

#: A kind of KV cache (transformers' ``Cache``, :class:`agent_shell.lm.jax_kv.StreamKV`).
CacheT = TypeVar("CacheT")
#: What a snapshot of such a cache keeps (its keys and values, never copied).
SavedT = TypeVar("SavedT")
#: A pass's output (a transformers model output, :class:`agent_shell.lm.records.StreamOutput`).
OutputT = TypeVar("OutputT")
#: A backend's causal pass over a chunk of tokens into a cache, as its :class:`CacheOps` calls it.
Forward = Callable[..., OutputT]


@runtime_checkable
class CacheOps(Protocol[CacheT, SavedT, OutputT]):
    """What :class:`PrefixCache` needs of one kind of KV cache: the bookkeeping of which tokens a
    cache holds, which prefix to reuse and which heads to pin is the same for every kind.

    Attributes:
        chunk: the most new tokens one pass encodes (a prefill chunk).
    """

    chunk: int

    def new(self) -> CacheT:
        """An empty batch-1 cache."""
        ...

    def snapshot(self, cache: CacheT) -> SavedT:
        """What :meth:`from_snapshot` rebuilds ``cache`` from (its keys and values, never copied)."""
        ...

    def from_snapshot(self, saved: SavedT, length: int) -> CacheT:
        """A new cache holding the first ``length`` tokens of ``saved``."""
        ...

    def cut(self, cache: CacheT, length: int) -> None:
        """Keep only the first ``length`` tokens of ``cache``."""
        ...

    def truncatable(self, cache: CacheT) -> bool:
        """Whether :meth:`cut` can roll ``cache`` back (full-attention layers only)."""
        ...

    def encode(self, forward: Forward[OutputT], cache: CacheT, ids: Sequence[int], start: int) -> OutputT:
        """One pass of ``forward`` over ``ids`` at positions ``start, start + 1, ...`` into ``cache``
        (which holds ``start`` tokens); the pass's output, with the next-token logits of its last token."""
        ...


class HeadStore(Generic[SavedT]):
    """Pinned prompt heads: token ids -> a snapshot of their cache (a :meth:`CacheOps.snapshot`),
    least recently used dropped first.

    Args:
        max_heads: how many heads are kept (one per task type is typical: ALFWorld has 6).
    """

    def __init__(self, max_heads: int = 16):
        if max_heads < 1:
            raise ValueError(f"max_heads={max_heads}: keep at least one head")
        self.max_heads = max_heads
        self._heads: OrderedDict[tuple[int, ...], SavedT] = OrderedDict()

    def __len__(self) -> int:
        return len(self._heads)

    def __contains__(self, ids: Sequence[int]) -> bool:
        return tuple(ids) in self._heads

    def add(self, ids: Sequence[int], saved: SavedT) -> None:
        """Pin ``saved`` (a snapshot covering exactly ``ids``)."""
        ids = tuple(ids)
        self._heads[ids] = saved
        self._heads.move_to_end(ids)
        while len(self._heads) > self.max_heads:
            self._heads.popitem(last=False)

    def best(self, ids: Sequence[int]) -> tuple[int, SavedT | None]:
        """(length, keys and values) of the pinned head sharing the longest token prefix with ``ids``;
        (0, None) when none shares a token."""
        best_len, best = 0, None
        for head_ids, saved in self._heads.items():
            n = common_prefix_len(head_ids, ids)
            if n > best_len:
                best_len, best, best_ids = n, saved, head_ids
        if best is not None:
            self._heads.move_to_end(best_ids)
        return best_len, best


class PrefixCache(Generic[CacheT, SavedT, OutputT]):
    """The stored prefix cache of one backend view: the token ids it covers and the cache (batch 1),
    beside the pinned heads it shares with its forks.

    Args:
        ops: the cache kind's operations.
        reuse: keep the last context's cache and reuse its common prefix next call (and the heads).
        heads: the pinned heads to start from (default: a new, empty store).
    """

    def __init__(self, ops: CacheOps[CacheT, SavedT, OutputT], reuse: bool = True,
                 heads: HeadStore[SavedT] | None = None):
        self.ops = ops
        self.reuse = reuse
        self.heads: HeadStore[SavedT] = heads if heads is not None else HeadStore()
        self.ids: tuple[int, ...] = ()
        self.cache: CacheT | None = None
        #: tokens encoded by :meth:`prefill` so far (what prefix reuse saves shows here)
        self.encoded_tokens = 0

    def reset(self) -> None:
        """Forget the stored cache (e.g. at the start of an unrelated episode)."""
        self.cache, self.ids = None, ()

    def reusable(self, cache: CacheT) -> bool:
        """Only plain full-attention layers can be truncated to a shorter prefix."""
        return self.reuse and self.ops.truncatable(cache)

    def keep(self, cache: CacheT, ids: Sequence[int]) -> None:
        """Store ``cache`` as covering exactly ``ids``."""
        self.cache, self.ids = cache, tuple(ids)

    def start(self, ids: Sequence[int]) -> tuple[CacheT, int]:
        """(cache, n): a batch-1 cache already holding the first ``n`` tokens of ``ids`` (the longest
        prefix the stored cache or a pinned head shares with them; an empty cache and 0 when none
        does), for the caller to encode ``ids[n:]`` itself. The stored cache is detached: store
        the result with :meth:`keep` once it holds what it should."""
        ids = tuple(ids)
        start, head = self.reusable_prefix(ids)
        cache = None
        if head is not None:
            cache = self.ops.from_snapshot(head, start)
        elif start > 0:
            cache = self.cache
            if start < len(self.ids):
                self.ops.cut(cache, start)
        self.reset()
        if cache is None:
            cache = self.ops.new()
        return cache, start

    def reusable_prefix(self, ids: Sequence[int]) -> tuple[int, SavedT | None]:
        """(n, head): how many leading tokens of ``ids`` :meth:`start` would take from the stored
        cache or a pinned head instead of encoding them, and that head's keys and values when a
        pinned head holds more of them than the stored cache (None: the stored cache, or nothing
        when n == 0). Changes no cache (the head store marks the head as recently used)."""
        ids = tuple(ids)
        start = common_prefix_len(self.ids, ids) if self.cache is not None and self.reuse else 0
        head_len, head = self.heads.best(ids) if self.reuse else (0, None)
        if head is not None and head_len > start:
            return head_len, head
        return start, None

    def encode(self, cache: CacheT, ids: Sequence[int], start: int, forward: Forward[OutputT],
               stop: int | None = None) -> OutputT | None:
        """Encode ``ids[start:stop]`` (default: to the end) into ``cache`` (which holds ``ids[:start]``)
        in chunks of at most ``ops.chunk`` tokens (:data:`PREFILL_CHUNK` for transformers' caches); returns the last chunk's model output
        (its logits at the chunk's last token), or None when there was nothing to encode."""
        stop = len(ids) if stop is None else stop
        self.encoded_tokens += max(stop - start, 0)
        out = None
        for lo in range(start, stop, self.ops.chunk):
            out = self.ops.encode(forward, cache, ids[lo:min(lo + self.ops.chunk, stop)], lo)
        return out

    def prefill(self, ids: Sequence[int], forward: Forward[OutputT]) -> CacheT:
        """A batch-1 cache holding exactly ``ids``, reusing the stored cache's common prefix.

        The stored cache is detached while it is being changed, so an exception never leaves a
        cache whose contents disagree with its recorded ids. The result is stored again when it
        can be reused (then ``self.cache is`` the returned cache).
        """
        ids = tuple(ids)
        cache, start = self.start(ids)
        self.encode(cache, ids, start, forward)
        if len(ids) and self.reusable(cache):
            self.keep(cache, ids)
        return cache

    def pin(self, ids: Sequence[int], forward: Forward[OutputT]) -> bool:
        """Encode ``ids`` (starting from the best stored prefix) and pin them as a head; False when
        this cache keeps nothing (``reuse=False`` or a cache type that cannot be cut)."""
        ids = tuple(ids)
        if not ids or not self.reuse:
            return False
        if ids in self.heads:
            self.heads.best(ids)  # most recently used
            return True
        cache = self.prefill(ids, forward)
        if not self.reusable(cache):
            return False
        self.heads.add(ids, self.ops.snapshot(cache))
        return True


__all__ = ["PREFILL_CHUNK", "CacheOps", "CacheT", "Forward", "HeadStore", "OutputT", "PrefixCache", "SavedT"]
