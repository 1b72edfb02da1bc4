"""The prefix KV cache: a context's keys and values, kept and reused by the next call.

A backend keeps the transformers cache of the last context it encoded, with the token ids it
covers. The next call reuses the longest common token prefix and encodes only the rest, so an
episode whose context grows step by step encodes only its new tokens. Scoring and decoding
extend the cache temporarily and put it back (:meth:`PrefixCache.snapshot` /
:meth:`PrefixCache.restore`). One cache serves one stream of related contexts: a second stream
(scoring contexts beside routing prompts) needs a second cache, which
:meth:`agent_shell.lm.hf.HFLanguageModel.fork` gives.

Must not import the agents or the environments.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from agent_shell.lm.tokenization import common_prefix_len

#: Longest stretch of new context tokens encoded in one forward pass (bounds attention memory).
PREFILL_CHUNK = 2048

#: ``forward(input_ids [B, T], cache, **model kwargs) -> model output`` with ``use_cache=True``.
Forward = Callable[..., Any]


def new_cache(model: Any) -> Any:
    """An empty transformers ``DynamicCache`` for ``model``."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older signature
        return DynamicCache()


def snapshot(cache: Any) -> list[tuple[Any, Any]]:
    """The cache's per-layer (keys, values), to be put back with :func:`restore`."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def restore(cache: Any, saved: list[tuple[Any, Any]], length: int | None = None) -> None:
    """Put ``saved`` (from :func:`snapshot`) back into ``cache``, cut to ``length`` tokens if given."""
    for layer, (k, v) in zip(cache.layers, saved):
        if length is not None and k is not None:
            k, v = k[..., :length, :], v[..., :length, :]
        layer.keys, layer.values = k, v


class PrefixCache:
    """The stored prefix cache of one backend view: the token ids it covers and the cache (batch 1).

    Args:
        model: the causal LM (for empty caches).
        device: where token tensors go.
        reuse: keep the last context's cache and reuse its common prefix next call.
    """

    def __init__(self, model: Any, device: torch.device, reuse: bool = True):
        self.model = model
        self.device = device
        self.reuse = reuse
        self.ids: tuple[int, ...] = ()
        self.cache: Any = None

    def reset(self) -> None:
        """Forget the stored cache (e.g. at the start of an unrelated episode)."""
        self.cache, self.ids = None, ()

    def reusable(self, cache: Any) -> bool:
        """Only plain full-attention layers can be truncated to a shorter prefix."""
        layers = getattr(cache, "layers", None)
        return bool(self.reuse and layers) and all(type(l).__name__ == "DynamicLayer" for l in layers)

    def keep(self, cache: Any, ids: Sequence[int]) -> None:
        """Store ``cache`` as covering exactly ``ids``."""
        self.cache, self.ids = cache, tuple(ids)

    def prefill(self, ids: Sequence[int], forward: Forward) -> Any:
        """A batch-1 cache holding exactly ``ids``, reusing the stored cache's common prefix.

        The stored cache is detached while it is being changed, so an exception never leaves a
        cache whose contents disagree with its recorded ids. The result is stored again when it
        can be reused (then ``self.cache is`` the returned cache).
        """
        ids = tuple(ids)
        cache, start = None, 0
        if self.cache is not None and self.reuse:
            lcp = common_prefix_len(self.ids, ids)
            if lcp > 0:
                cache, start = self.cache, lcp
                if lcp < len(self.ids):
                    restore(cache, snapshot(cache), lcp)
        self.reset()
        if cache is None:
            cache = new_cache(self.model)
        for lo in range(start, len(ids), PREFILL_CHUNK):
            hi = min(lo + PREFILL_CHUNK, len(ids))
            chunk = torch.tensor([ids[lo:hi]], device=self.device)
            pos = torch.arange(lo, hi, device=self.device)[None]
            forward(chunk, cache, position_ids=pos, logits_to_keep=1)
        if len(ids) and self.reusable(cache):
            self.keep(cache, ids)
        return cache


__all__ = ["PREFILL_CHUNK", "PrefixCache", "new_cache", "restore", "snapshot"]
