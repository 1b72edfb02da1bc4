"""The prefix KV cache: a context's keys and values, kept and reused by the next call.

A backend keeps the transformers cache of the last context it encoded, with the token ids it
covers. The next call reuses the longest common token prefix and encodes only the rest, so an
episode whose context grows step by step encodes only its new tokens. Scoring and decoding
extend the cache temporarily and put it back (:func:`snapshot` / :func:`restore`). One cache
serves one stream of related contexts: a second stream (scoring contexts beside routing
prompts) needs a second cache, which :meth:`agent_shell.lm.hf.HFLanguageModel.fork` gives.

*Pinned heads* (:class:`HeadStore`) outlive the stream: the fixed head of a prompt (the ReAct
header and the demonstrations of a task type) is encoded once, pinned, and every later context
that starts with it (every episode of that task type, whatever ran in between) starts from its
keys and values instead of re-encoding it. A prefill starts from whichever of the stream and
the pinned heads shares the longest token prefix with the new context. Forks share one store.
Keys and values are never changed in place (transformers' ``DynamicLayer`` grows them by
concatenation and :func:`restore` only slices), so a head and the caches built on it share
their tensors safely.

The bookkeeping (:class:`PrefixCache`, :class:`HeadStore`) is the same for every kind of cache;
what a cache is and how a pass writes into it is a :class:`CacheOps`: :class:`TransformersKV`
here, :class:`agent_shell.lm.jax_kv.JaxKV` for the JAX backend. Imports torch only where a
transformers cache is made or fed.

Must not import the agents or the environments.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from agent_shell.lm.tokenization import common_prefix_len

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel
    from transformers.cache_utils import Cache
    from transformers.modeling_outputs import CausalLMOutputWithPast

#: Longest stretch of new context tokens encoded in one forward pass (bounds attention memory).
PREFILL_CHUNK = 2048

#: ``forward(input_ids [B, T], cache, **model kwargs) -> model output`` with ``use_cache=True``.
Forward = Callable[..., "CausalLMOutputWithPast"]
#: A cache's per-layer (keys [B, heads, T, d], values [B, heads, T, d]), as :func:`snapshot` takes them.
Snapshot = list[tuple["torch.Tensor | None", "torch.Tensor | None"]]


def new_cache(model: PreTrainedModel) -> Cache:
    """An empty transformers ``DynamicCache`` for ``model``."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older signature
        return DynamicCache()


def from_snapshot(model: PreTrainedModel, saved: Snapshot, length: int) -> Cache:
    """A new cache holding the first ``length`` tokens of ``saved`` (a :func:`snapshot`); the
    tensors are sliced, not copied."""
    cache = new_cache(model)
    if len(cache.layers) != len(saved):
        raise ValueError(f"a cache of {len(cache.layers)} layers cannot take a snapshot of {len(saved)}")
    for layer, (k, v) in zip(cache.layers, saved):
        try:
            layer.lazy_initialization(k, v)
        except TypeError:  # transformers releases whose layers take the keys only
            layer.lazy_initialization(k)
        layer.keys, layer.values = k[..., :length, :], v[..., :length, :]
    return cache


def snapshot(cache: Cache) -> Snapshot:
    """The cache's per-layer (keys, values), to be put back with :func:`restore`."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def restore(cache: Cache, saved: Snapshot, length: int | None = None) -> None:
    """Put ``saved`` (from :func:`snapshot`) back into ``cache``, cut to ``length`` tokens if given."""
    for layer, (k, v) in zip(cache.layers, saved):
        if length is not None and k is not None:
            k, v = k[..., :length, :], v[..., :length, :]
        layer.keys, layer.values = k, v


class HeadStore:
    """Pinned prompt heads: token ids -> per-layer (keys, values), least recently used dropped first.

    Args:
        max_heads: how many heads are kept (one per task type is typical: ALFWorld has 6).
    """

    def __init__(self, max_heads: int = 16):
        if max_heads < 1:
            raise ValueError(f"max_heads={max_heads}: keep at least one head")
        self.max_heads = max_heads
        self._heads: OrderedDict[tuple[int, ...], Snapshot] = OrderedDict()

    def __len__(self) -> int:
        return len(self._heads)

    def __contains__(self, ids: Sequence[int]) -> bool:
        return tuple(ids) in self._heads

    def add(self, ids: Sequence[int], saved: Snapshot) -> None:
        """Pin ``saved`` (a :func:`snapshot` covering exactly ``ids``)."""
        ids = tuple(ids)
        self._heads[ids] = saved
        self._heads.move_to_end(ids)
        while len(self._heads) > self.max_heads:
            self._heads.popitem(last=False)

    def best(self, ids: Sequence[int]) -> tuple[int, Snapshot | None]:
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


def truncatable(cache: Cache | None) -> bool:
    """Whether every layer of ``cache`` is a plain full-attention layer (transformers'
    ``DynamicLayer``), whose keys and values :func:`restore` can cut to a shorter prefix; a
    sliding-window or linear-attention layer cannot be rolled back."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer).__name__ == "DynamicLayer" for layer in layers)


class CacheOps(Protocol):
    """What :class:`PrefixCache` needs of one kind of KV cache (:class:`TransformersKV` for the
    PyTorch backend, :class:`agent_shell.lm.jax_kv.JaxKV` for the JAX one): the bookkeeping
    of which tokens a cache holds, which prefix to reuse and which heads to pin is the same."""

    def new(self) -> Any:
        """An empty batch-1 cache."""

    def snapshot(self, cache: Any) -> Any:
        """What :meth:`from_snapshot` rebuilds ``cache`` from (its keys and values, never copied)."""

    def from_snapshot(self, saved: Any, length: int) -> Any:
        """A new cache holding the first ``length`` tokens of ``saved``."""

    def cut(self, cache: Any, length: int) -> None:
        """Keep only the first ``length`` tokens of ``cache``."""

    def truncatable(self, cache: Any) -> bool:
        """Whether :meth:`cut` can roll ``cache`` back (full-attention layers only)."""

    def encode(self, forward: Forward, cache: Any, ids: Sequence[int], start: int) -> Any:
        """One pass of ``forward`` over ``ids`` at positions ``start, start + 1, ...`` into ``cache``
        (which holds ``start`` tokens); the pass's output, with the next-token logits of its last token."""


class TransformersKV:
    """:class:`CacheOps` of transformers' caches, for ``model`` on ``device``."""

    def __init__(self, model: PreTrainedModel, device: torch.device):
        self.model = model
        self.device = device

    def new(self) -> Cache:
        return new_cache(self.model)

    def snapshot(self, cache: Cache) -> Snapshot:
        return snapshot(cache)

    def from_snapshot(self, saved: Snapshot, length: int) -> Cache:
        return from_snapshot(self.model, saved, length)

    def cut(self, cache: Cache, length: int) -> None:
        restore(cache, snapshot(cache), length)

    def truncatable(self, cache: Cache) -> bool:
        return truncatable(cache)

    def encode(self, forward: Forward, cache: Cache, ids: Sequence[int], start: int) -> CausalLMOutputWithPast:
        import torch

        chunk = torch.tensor([tuple(ids)], device=self.device)
        pos = torch.arange(start, start + len(ids), device=self.device)[None]
        return forward(chunk, cache, position_ids=pos, logits_to_keep=1)


class PrefixCache:
    """The stored prefix cache of one backend view: the token ids it covers and the cache (batch 1),
    beside the pinned heads it shares with its forks.

    Args:
        model: the causal LM (for empty caches).
        device: where token tensors go.
        reuse: keep the last context's cache and reuse its common prefix next call (and the heads).
        heads: the pinned heads to start from (default: a new, empty store).
        ops: the cache kind's operations (default: :class:`TransformersKV` of ``model`` on ``device``).
    """

    def __init__(self, model: Any, device: Any, reuse: bool = True, heads: HeadStore | None = None,
                 ops: CacheOps | None = None):
        self.model = model
        self.device = device
        self.ops: CacheOps = ops if ops is not None else TransformersKV(model, device)
        self.reuse = reuse
        self.heads = heads if heads is not None else HeadStore()
        self.ids: tuple[int, ...] = ()
        self.cache: Cache | None = None
        #: tokens encoded by :meth:`prefill` so far (what prefix reuse saves shows here)
        self.encoded_tokens = 0

    def reset(self) -> None:
        """Forget the stored cache (e.g. at the start of an unrelated episode)."""
        self.cache, self.ids = None, ()

    def reusable(self, cache: Cache) -> bool:
        """Only plain full-attention layers can be truncated to a shorter prefix."""
        return self.reuse and self.ops.truncatable(cache)

    def keep(self, cache: Cache, ids: Sequence[int]) -> None:
        """Store ``cache`` as covering exactly ``ids``."""
        self.cache, self.ids = cache, tuple(ids)

    def start(self, ids: Sequence[int]) -> tuple[Cache, int]:
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

    def reusable_prefix(self, ids: Sequence[int]) -> tuple[int, Snapshot | None]:
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

    def encode(self, cache: Any, ids: Sequence[int], start: int, forward: Forward,
               stop: int | None = None) -> Any:
        """Encode ``ids[start:stop]`` (default: to the end) into ``cache`` (which holds ``ids[:start]``)
        in chunks of at most :data:`PREFILL_CHUNK` tokens; returns the last chunk's model output
        (its logits at the chunk's last token), or None when there was nothing to encode."""
        stop = len(ids) if stop is None else stop
        self.encoded_tokens += max(stop - start, 0)
        out = None
        for lo in range(start, stop, PREFILL_CHUNK):
            out = self.ops.encode(forward, cache, ids[lo:min(lo + PREFILL_CHUNK, stop)], lo)
        return out

    def prefill(self, ids: Sequence[int], forward: Forward) -> Cache:
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

    def pin(self, ids: Sequence[int], forward: Forward) -> bool:
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


__all__ = ["PREFILL_CHUNK", "CacheOps", "HeadStore", "PrefixCache", "Snapshot", "TransformersKV", "from_snapshot",
           "new_cache", "restore", "snapshot"]
