"""The PyTorch backend's KV caches: transformers' ``DynamicCache`` as a
:class:`agent_shell.lm.kv_cache.CacheOps` (:class:`TransformersKV`), and the snapshots the prefix
cache keeps of it.

Keys and values are never changed in place (transformers' ``DynamicLayer`` grows them by
concatenation and :func:`restore` only slices), so a pinned head and the caches built on it share
their tensors safely. Imports torch only where a cache is fed.

Must not import the agents or the environments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from agent_shell.lm import kv_cache

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel
    from transformers.cache_utils import Cache
    from transformers.modeling_outputs import CausalLMOutputWithPast

#: ``forward(input_ids [B, T], cache, **model kwargs) -> model output`` with ``use_cache=True``.
Forward = kv_cache.Forward["CausalLMOutputWithPast"]
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


def truncatable(cache: Cache | None) -> bool:
    """Whether every layer of ``cache`` is a plain full-attention layer (transformers'
    ``DynamicLayer``), whose keys and values :func:`restore` can cut to a shorter prefix; a
    sliding-window or linear-attention layer cannot be rolled back."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer).__name__ == "DynamicLayer" for layer in layers)


class TransformersKV:
    """:class:`agent_shell.lm.kv_cache.CacheOps` of transformers' caches (``CacheOps[Cache, Snapshot,
    CausalLMOutputWithPast]``), for ``model`` on ``device``."""

    chunk = kv_cache.PREFILL_CHUNK

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


__all__ = ["Forward", "Snapshot", "TransformersKV", "from_snapshot", "new_cache", "restore", "snapshot", "truncatable"]
