"""Shared-prefix attention: many sampled replies over one prompt, the prompt's keys and values read once.

Sampling ``n`` replies of one prompt (ScienceWorld's open action space: 20 replies at T = 0.7)
used to copy the prompt's cache ``n`` times (``batch_repeat_interleave``) and then grow every
copy by concatenation at each new token: for a 3,000-token prompt of SmolLM2-135M (30 layers,
3 key/value heads of 64) that is 2.8 GB of keys and values written per token in float32.

Here the prompt's cache stays one row. The replies' own tokens go to a small per-row *suffix*
cache, and each layer's attention for the rows' one new query token reads the prompt's keys
once for all rows (a grouped matrix product: the ``g`` query heads of a key/value head, for all
rows, against its keys) and the row's suffix; one softmax over the concatenated scores gives
exactly the attention over prompt + suffix (the decomposition of attention over a shared prefix
and per-sequence suffixes of cascade inference, Ye et al. 2024, "Cascade inference: memory
bandwidth efficient shared prefix batch decoding", and of Hydragen, Juravsky et al. 2024,
Sec. 3). Only standard full causal attention (Llama, Qwen2, Qwen3) qualifies
(:func:`supports`); other models keep the copying path.

Must not import the agents or the environments.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Iterator

import torch

from agent_shell.lm.model_config import ARCHITECTURES
from agent_shell.lm.torch_kv import new_cache, truncatable

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from transformers.cache_utils import Cache

#: The name under which :func:`attention` is registered with transformers' ``AttentionInterface``.
ATTENTION = "cb_shared_prefix"

#: Architectures whose every layer is full causal attention of the standard form (rotary
#: positions applied before the cache, no soft-capping, no sinks, no sliding window when
#: ``use_sliding_window`` is off): the decoder families of
#: :data:`agent_shell.lm.model_config.ARCHITECTURES`, the one family list.
SUPPORTED = frozenset(ARCHITECTURES)


def supports(model: PreTrainedModel) -> bool:
    """Whether ``model`` (a transformers causal LM) can decode rows with :func:`attention`."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED:
        return False
    if getattr(config, "use_sliding_window", False):
        return False
    layer_types = getattr(config, "layer_types", None)
    return layer_types is None or all(t == "full_attention" for t in layer_types)


class PromptKV:
    """The prompt's keys and values as :func:`attention` reads them: per layer [Hkv, L, d] in
    float32, converted once per decoding call (a no-op for a float32 model), not once per token.

    Args:
        cache: the prompt's transformers cache, batch 1, every layer a ``DynamicLayer``.
        length: the prompt's tokens, which the cache must hold exactly.

    Raises:
        ValueError: a cache of another batch size or length, or with layers that are not plain
            full-attention layers.
    """

    def __init__(self, cache: Cache, length: int) -> None:
        if not truncatable(cache):
            raise ValueError("shared-prefix attention needs a cache of plain full-attention layers (DynamicLayer)")
        shape = tuple(cache.layers[0].keys.shape)
        if shape[0] != 1 or shape[2] != length:
            raise ValueError(f"the prompt's cache holds keys of shape {shape}, not [1, Hkv, {length}, d]")
        self.cache = cache
        self._layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s (keys, values), each [Hkv, L, d] float32."""
        if index not in self._layers:
            layer = self.cache.layers[index]
            self._layers[index] = (layer.keys[0].float(), layer.values[0].float())
        return self._layers[index]


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, *,
              shared_prefix: PromptKV, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """One layer's attention of ``R`` rows' single new tokens over a shared prompt and their suffixes.

    Args:
        module: the attention module (its ``layer_idx`` picks the prompt's layer).
        query: [R, H, 1, d], the rows' new query states (rotary positions applied).
        key, value: [R, Hkv, t, d], each row's suffix (its reply tokens so far, the new one
            included), as returned by the suffix cache's ``update``.
        attention_mask: must be None: one query at the end of its unpadded sequence sees every
            token (transformers builds no mask for an attention it does not know).
        scaling: the softmax scale (``head_dim ** -0.5``).
        dropout: ignored (inference only).
        shared_prefix: the prompt's keys and values (:class:`PromptKV`).

    Returns:
        ([R, 1, H, d] attention output in ``query``'s dtype, None). Scores, softmax and the
        weighted sums run in float32 (the reference kernels accumulate in float32 too).

    Raises:
        ValueError: more than one query token per row, a mask, or a head count that is not a
            multiple of the key/value heads.
    """
    rows, heads, q_len, dim = query.shape
    if q_len != 1:
        raise ValueError(f"shared-prefix attention decodes one token per row, got {q_len}")
    if attention_mask is not None:
        raise ValueError("shared-prefix attention takes no attention mask (its rows are unpadded)")
    k_pre, v_pre = shared_prefix.layer(module.layer_idx)  # [Hkv, L, d] float32
    kv_heads, length = k_pre.shape[0], k_pre.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads")
    groups = heads // kv_heads
    q = query.float().reshape(rows, kv_heads, groups, dim) * scaling  # head h reads key/value head h // groups
    q_pre = q.permute(1, 0, 2, 3).reshape(kv_heads, rows * groups, dim)
    s_pre = torch.matmul(q_pre, k_pre.transpose(-1, -2))  # [Hkv, R*g, L]
    s_suf = torch.matmul(q, key.float().transpose(-1, -2))  # [R, Hkv, g, t]
    s_suf = s_suf.permute(1, 0, 2, 3).reshape(kv_heads, rows * groups, -1)
    probs = torch.softmax(torch.cat([s_pre, s_suf], dim=-1), dim=-1)
    out = torch.matmul(probs[..., :length], v_pre)  # [Hkv, R*g, d]
    p_suf = probs[..., length:].reshape(kv_heads, rows, groups, -1).permute(1, 0, 2, 3)  # [R, Hkv, g, t]
    out = out.reshape(kv_heads, rows, groups, dim).permute(1, 0, 2, 3) + torch.matmul(p_suf, value.float())
    return out.reshape(rows, 1, heads, dim).to(query.dtype), None


_registered = False


def _register() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(ATTENTION, attention)
        _registered = True


@contextmanager
def _active(model: PreTrainedModel) -> Iterator[None]:
    """Route ``model``'s attention through :func:`attention` for the ``with`` block (the forward
    passes must then pass ``shared_prefix=PromptKV(<prompt cache>, length)``)."""
    _register()
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = previous


class SharedPrefix:
    """What :func:`agent_shell.lm.decoding.decode` needs to decode rows over one shared prompt
    cache of ``model``: an empty per-row cache for the replies' tokens (:meth:`new_cache`) and
    the attention switch (:meth:`active`).

    Raises:
        ValueError: ``model`` is not supported (:func:`supports`).
    """

    def __init__(self, model: PreTrainedModel) -> None:
        if not supports(model):
            raise ValueError(f"shared-prefix attention does not support model type "
                             f"{getattr(model.config, 'model_type', None)!r} (supported: {sorted(SUPPORTED)})")
        self.model = model

    @classmethod
    def of(cls, model: PreTrainedModel) -> "SharedPrefix | None":
        """The sharing of ``model``, or None when it is not supported."""
        return cls(model) if supports(model) else None

    def new_cache(self) -> Cache:
        """An empty transformers cache for the rows' own tokens."""
        return new_cache(self.model)

    def active(self) -> AbstractContextManager[None]:
        """The model's attention routed through :func:`attention` for a ``with`` block; the previous
        implementation is put back afterwards, also on error. Not for concurrent use of one model
        from several threads."""
        return _active(self.model)


__all__ = ["ATTENTION", "SUPPORTED", "PromptKV", "SharedPrefix", "attention", "supports"]
