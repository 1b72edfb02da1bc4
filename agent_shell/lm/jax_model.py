"""A decoder-only transformer in Flax NNX for the Llama and Qwen2/Qwen3 families, read from a
HuggingFace model folder (``config.json`` and safetensors weights) with no conversion step.

The architectures follow transformers' ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` and
``Qwen3ForCausalLM`` operation for operation (Touvron et al. 2023, "Llama 2", Sec. 2.2; Qwen2
technical report, Sec. 2.2): pre-norm RMSNorm blocks, grouped-query attention with rotary
position embeddings (Su et al. 2021; the "rotate half" layout), a SwiGLU MLP, a final RMSNorm and
an LM head (tied to the token embeddings when the config says so). Qwen2 adds biases to the
query, key and value projections; Qwen3 normalises each head's queries and keys (RMSNorm over
the head dimension) before the rotation. RoPE variants: ``default``, ``linear`` and ``llama3``
(Llama 3.1's frequency-band scaling). Anything else (another architecture, sliding-window
attention, another activation, another RoPE type, partial rotary dimensions) is refused by
:func:`read_config` in one line naming what is supported. The folder is read as transformers reads
it (:mod:`agent_shell.lm.model_config`: its settings through ``AutoConfig``, the LM head as
transformers ties or unties it) and checked against its weights first
(:mod:`agent_shell.lm.model_folder`).

The decoder layers are stacked (every weight has a leading layer axis) and run with
``nnx.scan``, so a compiled program's size does not grow with the depth. One pass
(:meth:`Decoder.__call__`) takes T new tokens per row; each token attends to

* the filled slots of a *shared* key/value buffer read by every row (a prompt's cache under
  sampled rows, [L, 1, Hkv, C, hd]),
* the filled slots of its *row's* buffer ([L, B, Hkv, S, hd]; a stream's cache, batch 1), and
* the pass's own tokens under a boolean mask (causal for text, a prefix tree's ancestry for
  candidates),

and the pass writes its keys and values into the row buffers after their filled slots
(``jax.lax.dynamic_update_slice`` on the scan's carry: in place when the buffers are donated).
Buffers are read block by block up to their filled length, a run-time value (an online softmax,
:class:`_Softmax`), so one compiled program serves every context length its buffer holds and
costs what the keys cost. The one pass serves a prefill chunk, the prefix-tree scoring row,
right-padded candidate rows over one context, and sampled rows over one prompt.
Attention scores, the softmax and every RMSNorm run in float32; matrix products run in the
weights' dtype (float32 at ``Precision.HIGHEST``, so GPUs do not drop to TF32) with float32
accumulation.

Must not import the agents, the environments or torch.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.typing import DTypeLike

from agent_shell.lm.jax_mesh import Placement, check_divides, place
from agent_shell.lm.model_config import (ARCHITECTURES, EMBED, HEAD, ROPE_TYPES, DecoderConfig, UnsupportedModel,
                                         layer_tensors, read_config)
from agent_shell.lm.model_folder import check_tensor_shapes, refuse_nonfinite, tensor_shapes, weight_files

def inv_freq(config: DecoderConfig) -> np.ndarray:
    """float32 [head_dim / 2]: the rotary inverse frequencies of ``config``, computed as
    transformers computes them (float32 throughout, so the rotation angles agree bit for bit)."""
    dim = config.head_dim
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        inv = 1.0 / (jnp.float32(config.rope_theta) ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
        p = dict(config.rope_scaling)
        if config.rope_type == "linear":
            inv = inv / jnp.float32(p["factor"])
        elif config.rope_type == "llama3":
            factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
            old = p["original_max_position_embeddings"]
            low_wavelen, high_wavelen = old / low, old / high
            wavelen = 2 * np.pi / inv
            scaled = jnp.where(wavelen > low_wavelen, inv / factor, inv)
            smooth = (old / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
            inv = jnp.where(medium, smoothed, scaled)
        return np.asarray(inv, dtype=np.float32)


# ---------------------------------------------------------------------------------------- weights
class WeightFiles(Mapping[str, np.ndarray]):
    """A model folder's safetensors tensors by name, each read when asked for (one at a time): the
    whole model never sits in the host's memory. :meth:`block` reads part of one tensor.

    Raises:
        FileNotFoundError: no safetensors weights in ``folder``.
        agent_shell.lm.model_config.BadModelFolder: a file that is no whole safetensors file.
    """

    def __init__(self, folder: str | os.PathLike):
        from safetensors import safe_open

        files = weight_files(folder)
        if not files:
            raise FileNotFoundError(f"{str(folder)!r} holds no safetensors weights (model.safetensors or an index)")
        tensor_shapes(folder)  # a truncated file or an LFS pointer: one line naming it
        self._files = {}
        for path in files:
            handle = safe_open(str(path), framework="np")
            self._files.update(dict.fromkeys(handle.keys(), handle))

    def __getitem__(self, name: str) -> np.ndarray:
        return self._files[name].get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)

    def shape(self, name: str) -> tuple[int, ...]:
        """Tensor ``name``'s shape, from its file's header (nothing read)."""
        return tuple(self._files[name].get_slice(name).get_shape())

    def block(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """The ``index`` block (a tuple of slices) of tensor ``name``, reading only that block."""
        return self._files[name].get_slice(name)[index]


def read_weights(folder: str | os.PathLike) -> WeightFiles:
    """Every tensor of a model folder's safetensors files (sharded or not,
    :func:`agent_shell.lm.model_folder.weight_files`), by name, read as numpy arrays in their
    stored dtype (bfloat16 as ``ml_dtypes.bfloat16``) when asked for (:class:`WeightFiles`).

    Raises:
        FileNotFoundError: no safetensors weights in ``folder``.
        agent_shell.lm.model_config.BadModelFolder: a file that is no whole safetensors file.
    """
    return WeightFiles(folder)


def _shape(weights: Mapping[str, Any], name: str) -> tuple[int, ...]:
    return weights.shape(name) if isinstance(weights, WeightFiles) else tuple(np.shape(weights[name]))


def _block(weights: Mapping[str, Any], name: str, index: tuple[slice, ...]) -> np.ndarray:
    return weights.block(name, index) if isinstance(weights, WeightFiles) else np.asarray(weights[name])[index]


def nonfinite_counts(weights: Mapping[str, Any]) -> Iterator[tuple[str, int]]:
    """(name, how many entries are NaN or infinite) of each floating-point tensor, lazily."""
    for name, w in weights.items():
        a = np.asarray(w)
        if np.issubdtype(a.dtype, np.floating) or a.dtype.name == "bfloat16":
            yield name, int(a.size - np.count_nonzero(np.isfinite(a)))


# ---------------------------------------------------------------------------------------- modules
def _dot(x: jax.Array, w: jax.Array, precision: jax.lax.Precision) -> jax.Array:
    """``x @ w.T`` for a weight in transformers' [out, in] layout, accumulated in float32."""
    return jnp.einsum("...i,oi->...o", x, w, precision=precision, preferred_element_type=jnp.float32).astype(x.dtype)


class Linear(nnx.Module):
    """A projection with transformers' weight layout ([out, in]) and an optional bias."""

    def __init__(self, weight: jax.Array, bias: jax.Array | None, precision: jax.lax.Precision):
        self.weight = nnx.Param(weight)
        self.bias = nnx.Param(bias) if bias is not None else None
        self.precision = precision

    def __call__(self, x: jax.Array) -> jax.Array:
        y = _dot(x, self.weight[...], self.precision)
        return y + self.bias[...] if self.bias is not None else y


class RMSNorm(nnx.Module):
    """RMSNorm as transformers computes it: normalised in float32, cast back, then scaled."""

    def __init__(self, weight: jax.Array, eps: float):
        self.weight = nnx.Param(weight)
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...] * x32.astype(x.dtype)


def _rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """RoPE in the "rotate half" layout; x [B, T, heads, hd], cos/sin [B, T, 1, hd] in x's dtype."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


@dataclass(frozen=True)
class KV:
    """Keys and values with a leading layer axis: the argument and result of a pass."""

    keys: jax.Array
    values: jax.Array


jax.tree_util.register_dataclass(KV, data_fields=["keys", "values"], meta_fields=[])


#: Keys read per step of the loop over a buffer's filled slots (buffers hold a multiple of it).
KEY_BLOCK = 128


@dataclass(frozen=True)
class _Softmax:
    """A softmax-weighted sum over keys met block by block (the running maximum ``top``, the sum
    of exponentials ``total`` and the weighted values ``acc``, all float32; Milakov & Gimelshein
    2018, "Online normalizer calculation for softmax"): a buffer's filled slots are read in
    blocks of :data:`KEY_BLOCK` up to a length known only at run time, so a pass costs what its
    keys cost, not what its buffer holds."""

    top: jax.Array  # [B, Hkv, Q]
    total: jax.Array  # [B, Hkv, Q]
    acc: jax.Array  # [B, Hkv, Q, hd]

    @classmethod
    def empty(cls, shape: tuple[int, ...]) -> "_Softmax":
        f32 = jnp.float32
        return cls(jnp.full(shape[:-1], jnp.finfo(f32).min, f32), jnp.zeros(shape[:-1], f32), jnp.zeros(shape, f32))

    def add(self, q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array, precision: jax.lax.Precision) -> "_Softmax":
        """Fold in ``keys``/``values`` [B, Hkv, n, hd] (or [Hkv, n, hd] for every row) under ``mask``
        (broadcast to [B, Hkv, Q, n]); q [B, Hkv, Q, hd], already scaled."""
        f32 = jnp.float32
        if keys.ndim == 3 and keys.dtype == jnp.bfloat16:  # every row reads one buffer: XLA's CPU dot has no
            # bfloat16 x bfloat16 -> float32 kernel for a batch dimension on one side only, so give it both
            keys = jnp.broadcast_to(keys, (q.shape[0], *keys.shape))
            values = jnp.broadcast_to(values, (q.shape[0], *values.shape))
        spec = ("bkqd,bknd->bkqn", "bkqn,bknd->bkqd") if keys.ndim == 4 else ("bkqd,knd->bkqn", "bkqn,knd->bkqd")
        scores = jnp.einsum(spec[0], q, keys, precision=precision, preferred_element_type=f32)
        scores = jnp.where(mask, scores, jnp.finfo(f32).min)
        top = jnp.maximum(self.top, scores.max(-1))
        weights = jnp.exp(scores - top[..., None]) * mask
        rescale = jnp.exp(self.top - top)
        acc = jnp.einsum(spec[1], weights.astype(values.dtype), values, precision=precision, preferred_element_type=f32)
        return _Softmax(top, self.total * rescale + weights.sum(-1), self.acc * rescale[..., None] + acc)

    def add_buffer(self, q: jax.Array, keys: jax.Array, values: jax.Array, layer: jax.Array, length: jax.Array,
                   precision: jax.lax.Precision, shared: bool) -> "_Softmax":
        """Fold in layer ``layer``'s first ``length`` slots of a buffer ([L, B, Hkv, S, hd];
        ``shared``: [L, 1, Hkv, S, hd] read by every row), every query seeing every slot."""
        block = min(KEY_BLOCK, keys.shape[3])

        def step(i: jax.Array, state: _Softmax) -> _Softmax:
            at = (layer, 0, 0, i * block, 0)
            size = (1, *keys.shape[1:3], block, keys.shape[4])
            kb = jax.lax.dynamic_slice(keys, at, size)[0]
            vb = jax.lax.dynamic_slice(values, at, size)[0]
            if shared:
                kb, vb = kb[0], vb[0]
            seen = (i * block + jnp.arange(block)) < length
            return state.add(q, kb, vb, seen, precision)

        return jax.lax.fori_loop(0, (length + block - 1) // block, step, self)

    def result(self) -> jax.Array:
        """float32 [B, Hkv, Q, hd]: the attention output."""
        return self.acc / self.total[..., None]


jax.tree_util.register_dataclass(_Softmax, data_fields=["top", "total", "acc"], meta_fields=[])


class Block(nnx.Module):
    """One decoder layer: attention and a SwiGLU MLP, each after an RMSNorm, with residuals."""

    def __init__(self, c: DecoderConfig, w: Mapping[str, jax.Array], precision: jax.lax.Precision):
        def lin(name: str, bias: bool) -> Linear:
            return Linear(w[f"{name}.weight"], w[f"{name}.bias"] if bias else None, precision)

        self.input_norm = RMSNorm(w["input_layernorm.weight"], c.rms_norm_eps)
        self.q = lin("self_attn.q_proj", c.qkv_bias)
        self.k = lin("self_attn.k_proj", c.qkv_bias)
        self.v = lin("self_attn.v_proj", c.qkv_bias)
        self.o = lin("self_attn.o_proj", c.o_bias)
        self.q_norm = RMSNorm(w["self_attn.q_norm.weight"], c.rms_norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(w["self_attn.k_norm.weight"], c.rms_norm_eps) if c.qk_norm else None
        self.post_norm = RMSNorm(w["post_attention_layernorm.weight"], c.rms_norm_eps)
        self.gate = lin("mlp.gate_proj", c.mlp_bias)
        self.up = lin("mlp.up_proj", c.mlp_bias)
        self.down = lin("mlp.down_proj", c.mlp_bias)
        self.heads, self.kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.precision = precision

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, rows: KV, layer: jax.Array, at: jax.Array,
                 mask: jax.Array, shared: KV | None, shared_len: jax.Array | None) -> tuple[jax.Array, KV]:
        """x [B, T, D]; ``rows`` every layer's row buffers [L, B, Hkv, S, hd], of which this layer
        (``layer``) writes its keys and values at slot ``at`` (in place inside the scan). Each
        token attends to the first ``shared_len`` slots of ``shared`` ([L, 1, Hkv, C, hd], or
        None), to the first ``at`` slots of its row's buffer, and to the pass's own tokens where
        ``mask`` [B or 1, T, T] is true. Returns (the layer's output, the updated row buffers)."""
        b, t, _ = x.shape
        g = self.heads // self.kv_heads
        h = self.input_norm(x)
        q = self.q(h).reshape(b, t, self.heads, self.head_dim)
        k = self.k(h).reshape(b, t, self.kv_heads, self.head_dim)
        v = self.v(h).reshape(b, t, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        k, v = k.transpose(0, 2, 1, 3).astype(rows.keys.dtype), v.transpose(0, 2, 1, 3).astype(rows.values.dtype)
        zero = jnp.zeros((), jnp.int32)
        where = (layer, zero, zero, at, zero)
        rows = KV(jax.lax.dynamic_update_slice(rows.keys, k[None], where),
                  jax.lax.dynamic_update_slice(rows.values, v[None], where))
        # queries as [B, Hkv, g * T, hd] (query head h reads key/value head h // g): 4D scores, which
        # XLA's CPU dot and softmax handle several times faster than a 5D layout
        qg = q.reshape(b, t, self.kv_heads, g, self.head_dim).transpose(0, 2, 3, 1, 4)
        qg = qg.reshape(b, self.kv_heads, g * t, self.head_dim) * jnp.asarray(self.head_dim ** -0.5, q.dtype)
        state = _Softmax.empty(qg.shape)
        if shared is not None:
            state = state.add_buffer(qg, shared.keys, shared.values, layer, shared_len, self.precision, shared=True)
        state = state.add_buffer(qg, rows.keys, rows.values, layer, at, self.precision, shared=False)
        state = state.add(qg, k, v, jnp.tile(mask, (1, g, 1))[:, None], self.precision)
        out = state.result().astype(x.dtype)
        out = out.reshape(b, self.kv_heads, g, t, self.head_dim).transpose(0, 3, 1, 2, 4)
        x = x + self.o(out.reshape(b, t, self.heads * self.head_dim).astype(x.dtype))
        h = self.post_norm(x)
        x = x + self.down(jax.nn.silu(self.gate(h)) * self.up(h))
        return x, rows


class Decoder(nnx.Module):
    """The decoder: token embeddings, the stacked :class:`Block` s, the final norm and the LM head.

    Args:
        config: its :class:`DecoderConfig`.
        weights: transformers' tensor names (``model.layers.K.self_attn.q_proj.weight``, ...) ->
            arrays (numpy or JAX), as :func:`read_weights` gives them.
        dtype: the compute and storage dtype of every weight (``jnp.float32`` or ``jnp.bfloat16``).
        placement: the devices the weights go to, laid out tensor-parallel over them
            (:class:`agent_shell.lm.jax_mesh.Placement`; default JAX's default device, a mesh of one):
            each device reads and holds only its block of each split tensor.
        where: the folder, for error messages.

    Raises:
        ValueError: a mesh that does not divide the heads or the MLP's hidden axis
            (:func:`agent_shell.lm.jax_mesh.check_divides`).
        agent_shell.lm.model_config.BadModelFolder: a tensor the config implies is missing from
            ``weights`` or of another shape, or an untied head that is not stored
            (:func:`agent_shell.lm.model_folder.check_tensor_shapes`; one line naming it).
    """

    def __init__(self, config: DecoderConfig, weights: Mapping[str, Any], dtype: DTypeLike = jnp.float32,
                 placement: Placement | None = None, where: str | os.PathLike = "the weights"):
        self.config = config
        self.dtype = jnp.dtype(dtype)
        precision = jax.lax.Precision.HIGHEST if self.dtype == jnp.float32 else jax.lax.Precision.DEFAULT
        self.precision = precision
        placement = placement or Placement.over([jax.local_devices()[0]])
        check_divides(config, placement.size, where)
        # the head as transformers resolves it: stored embeddings and head of other values are both kept
        tied = check_tensor_shapes(where, config, {n: (_shape(weights, n), "") for n in weights},
                                   lambda: np.array_equal(np.asarray(weights[EMBED]), np.asarray(weights[HEAD])))
        if config.tie_word_embeddings and not tied:
            warnings.warn(f"{where}: config.json ties the LM head (tie_word_embeddings true), but the weights hold "
                          f"an {HEAD} other than {EMBED}: the stored head is used, as transformers uses it",
                          stacklevel=2)

        def get(name: str) -> jax.Array:
            shape = _shape(weights, name)
            return place(shape, self.dtype, placement.weight(name, shape, stacked=False),
                         lambda index: _block(weights, name, index))

        def stacked(suffix: str) -> jax.Array:
            names = [f"model.layers.{i}.{suffix}" for i in range(config.num_layers)]
            shape = (config.num_layers, *_shape(weights, names[0]))
            return place(shape, self.dtype, placement.weight(suffix, shape, stacked=True),
                         lambda index: np.stack([_block(weights, n, index[1:]) for n in names[index[0]]]))

        layer_weights = {name: stacked(name) for name in layer_tensors(config)}

        @nnx.vmap(in_axes=0, out_axes=0)
        def make(w: dict[str, jax.Array]) -> Block:
            return Block(config, w, precision)

        self.blocks = make(layer_weights)
        self.embed = nnx.Param(get(EMBED if EMBED in weights else HEAD))
        self.norm = RMSNorm(get("model.norm.weight"), config.rms_norm_eps)
        self.lm_head = None if tied else nnx.Param(get(HEAD))
        self.inv_freq = nnx.Variable(jax.device_put(inv_freq(config), placement.replicated))

    def head_weight(self) -> jax.Array:
        """The LM head's [V, D] weight (the embeddings when tied)."""
        return (self.embed if self.lm_head is None else self.lm_head)[...]

    def __call__(self, ids: jax.Array, positions: jax.Array, rows: KV, at: jax.Array, mask: jax.Array,
                 shared: KV | None = None, shared_len: jax.Array | None = None,
                 capture: jax.Array | None = None) -> tuple[jax.Array, KV, jax.Array | None]:
        """One pass over ``ids`` [B, T] at ``positions`` [B, T].

        Args:
            rows: the rows' buffers, [L, B, Hkv, S, hd] each (S a multiple of :data:`KEY_BLOCK` or
                smaller than it); every token sees its row's first ``at`` slots (int32 scalar), and
                the pass writes its keys and values from slot ``at`` on (in place when the caller
                donates the buffers to ``jax.jit``).
            mask: bool [B or 1, T, T]: which of the pass's own tokens each token sees (itself
                included: causal for a chunk of text, a prefix tree's ancestry for candidates).
            shared: a buffer every row reads, [L, 1, Hkv, C, hd] each, of which every token sees
                the first ``shared_len`` (int32 scalar) slots (a prompt's cache under sampled rows).
            capture: int32 [R]: flat indices into the B * T tokens whose states are returned at
                every layer (index 0: the embeddings; K: the output of layer K, before the final norm).

        Returns:
            (the final states after the last layer, before the final norm: [B, T, D] in the model's
            dtype; the updated row buffers; the captured states float32 [L + 1, R, D] or None).
        """
        b, t = ids.shape
        x = self.embed[...][ids]
        freqs = positions.astype(jnp.float32)[..., None] * self.inv_freq[...]
        emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
        cos, sin = jnp.cos(emb).astype(self.dtype), jnp.sin(emb).astype(self.dtype)

        def grab(h: jax.Array) -> jax.Array:
            return h.reshape(b * t, -1)[capture].astype(jnp.float32) if capture is not None else jnp.zeros((0,))

        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
        def layers(carry: tuple[jax.Array, KV, jax.Array], block: Block):
            h, kv, layer = carry
            h, kv = block(h, cos, sin, kv, layer, at, mask, shared, shared_len)
            return (h, kv, layer + 1), grab(h)

        (out, rows, _), captured = layers((x, rows, jnp.zeros((), jnp.int32)), self.blocks)
        if capture is None:
            return out, rows, None
        return out, rows, jnp.concatenate([grab(x)[None], captured])

    def head(self, states: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(the final norm of ``states`` [..., D], i.e. the LM head's input; the logits float32 [..., V])."""
        normed = self.norm(states)
        logits = jnp.einsum("...d,vd->...v", normed, self.head_weight(), precision=self.precision,
                            preferred_element_type=jnp.float32)
        return normed, logits.astype(self.dtype).astype(jnp.float32)


def load_decoder(folder: str | os.PathLike, dtype: DTypeLike = jnp.float32, placement: Placement | None = None,
                 read: Callable[[str | os.PathLike], Mapping[str, Any]] = read_weights) -> Decoder:
    """The :class:`Decoder` of a HuggingFace model folder, read as transformers reads it
    (:func:`agent_shell.lm.model_config.read_config`), its tensors read one at a time, each device's
    block straight to its device (``placement``: as :class:`Decoder`'s).

    Raises:
        FileNotFoundError: no config.json or no safetensors weights.
        UnsupportedModel: an architecture or setting the decoder does not implement.
        agent_shell.lm.model_config.BadModelFolder: a broken file, a tensor that disagrees with the
            config, or weights that are not finite (:func:`agent_shell.lm.model_folder.refuse_nonfinite`).
        ValueError: a mesh that does not divide the heads or the MLP's hidden axis.
    """
    config = read_config(folder)
    if placement is not None:
        check_divides(config, placement.size, folder)  # before any weight is read
    weights = read(folder)
    refuse_nonfinite(folder, nonfinite_counts(weights))
    return Decoder(config, weights, dtype=dtype, placement=placement, where=folder)


__all__ = ["ARCHITECTURES", "ROPE_TYPES", "KV", "Block", "Decoder", "DecoderConfig", "Linear", "RMSNorm",
           "UnsupportedModel", "WeightFiles", "inv_freq", "load_decoder", "nonfinite_counts", "read_config",
           "read_weights"]
