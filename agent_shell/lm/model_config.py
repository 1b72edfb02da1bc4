"""A HuggingFace model folder's settings read the way transformers reads them, for both backends.

``config.json`` goes through transformers' own ``AutoConfig`` (offline), so every default and every
precedence is transformers' own, not a copy: a missing ``max_position_embeddings`` is the
architecture's default, and ``rope_scaling`` replaces ``rope_parameters`` when a file has both
(transformers 5). :func:`read_config` turns that configuration into the :class:`DecoderConfig` of
the JAX decoder (:mod:`agent_shell.lm.jax_model`), refusing in one line what the decoder does not
implement; :func:`layer_tensors` and :func:`decoder_tensors` give the tensors, with their shapes,
that a configuration implies for the architectures it covers (Llama, Qwen2, Qwen3), which
:mod:`agent_shell.lm.model_folder` checks the weights against and the JAX decoder reads;
:func:`tied_head` is transformers' rule for where the LM head comes from; :func:`generation_eos`
the end-of-sequence ids of transformers' generation config.

Must not import the agents, the environments, torch or JAX (transformers only inside functions).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Container

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

#: model_type -> the transformers class whose folders the JAX decoder reads.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
#: RoPE types (``rope_parameters["rope_type"]``) the JAX decoder computes.
ROPE_TYPES = ("default", "linear", "llama3")
#: The token embeddings and the LM head, as transformers names them in the architectures above.
EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


class BadModelFolder(ValueError):
    """A model folder whose files are broken or disagree with each other: one line naming the
    file, the field and both values."""


class UnsupportedModel(ValueError):
    """A model folder whose architecture or settings the JAX decoder does not implement."""


@dataclass(frozen=True)
class DecoderConfig:
    """The settings of a decoder, as transformers reads them from ``config.json`` (:func:`read_config`).

    Attributes:
        model_type: ``"llama"``, ``"qwen2"`` or ``"qwen3"``.
        vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim:
            the shapes (``head_dim`` defaults to hidden_size / num_heads).
        rms_norm_eps: the RMSNorm epsilon.
        rope_theta: the RoPE base; ``rope_type`` and ``rope_scaling`` its variant and parameters.
        tie_word_embeddings: the config ties the LM head to the token embeddings (where the head
            comes from is :func:`tied_head`'s rule, which the weights decide too).
        qkv_bias, o_bias, mlp_bias: which projections have biases.
        qk_norm: RMSNorm over each head's queries and keys (Qwen3).
        max_position_embeddings: the context window (the architecture's default when the file has none).
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_type: str
    rope_scaling: tuple[tuple[str, float], ...]
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    max_position_embeddings: int


def read_json(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON object a file holds.

    Raises:
        BadModelFolder: the file cannot be read, is empty, is not JSON or holds no object (one
            line naming the file and where the text stops parsing).
    """
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise BadModelFolder(f"{path} cannot be read ({getattr(err, 'strerror', None) or err})") from None
    if not text.strip():
        raise BadModelFolder(f"{path} is empty")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise BadModelFolder(f"{path} is not valid JSON (line {err.lineno} column {err.colno}: {err.msg})") from None
    if not isinstance(value, dict):
        raise BadModelFolder(f"{path} holds a JSON {type(value).__name__}, not an object")
    return value


def load_config(folder: str | os.PathLike) -> PreTrainedConfig:
    """``config.json`` of a model folder as transformers' ``AutoConfig`` reads it (offline), refused
    in one line when it is broken or is no causal language model that ``AutoModelForCausalLM``
    loads (a multimodal folder such as LLaVA's, whose ``text_config`` describes its language model).

    Raises:
        FileNotFoundError: no ``config.json`` in ``folder``.
        BadModelFolder: ``config.json`` is not JSON, transformers cannot read it, or it is not a
            causal language model.
    """
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{str(folder)!r} holds no config.json: pass a HuggingFace model folder")
    raw = read_json(path)
    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise BadModelFolder(f"{path}: transformers cannot read it ({reason})") from None
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        inner = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else None
        hint = (f" (a multimodal model; its text_config describes a {inner.get('model_type')!r} language model: "
                "pass a folder holding that model alone)") if inner is not None else ""
        raise BadModelFolder(f"{path}: model_type {config.model_type!r} is not a causal language model "
                             f"(AutoModelForCausalLM loads none){hint}")
    return config


def _rope(config: PreTrainedConfig, where: str, strict: bool) -> tuple[float, str, tuple[tuple[str, float], ...]]:
    """(theta, type, scaling parameters) of transformers' ``rope_parameters``, in which transformers
    has already applied its precedence (``rope_scaling`` replaces ``rope_parameters``; ``rope_theta``
    filled in)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    kind = params.pop("rope_type", params.pop("type", "default")) or "default"
    theta = params.pop("rope_theta", getattr(config, "rope_theta", None) or 10000.0)
    partial = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if strict and kind not in ROPE_TYPES:
        raise UnsupportedModel(f"{where}: RoPE type {kind!r} is not implemented by the JAX decoder "
                               f"(supported: {', '.join(ROPE_TYPES)})")
    if strict and partial is not None and float(partial) != 1.0:
        raise UnsupportedModel(f"{where}: partial rotary dimensions are not implemented by the JAX decoder")
    need = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                              "original_max_position_embeddings")}.get(kind, ())
    missing = [k for k in need if params.get(k) is None]
    if strict and missing:
        raise UnsupportedModel(f"{where}: RoPE type {kind!r} needs {', '.join(missing)} in its parameters")
    scaling = tuple(sorted((k, float(v)) for k, v in params.items() if isinstance(v, (int, float))
                           and not isinstance(v, bool)))
    return float(theta), kind, scaling


def read_config(folder: str | os.PathLike, strict: bool = True) -> DecoderConfig:
    """The :class:`DecoderConfig` of a HuggingFace model folder, read by transformers
    (:func:`load_config`).

    Args:
        folder: the model folder.
        strict: refuse what the JAX decoder does not implement (another architecture, activation,
            sliding-window attention, RoPE type, partial rotary dimensions); False reads the
            shapes of any Llama, Qwen2 or Qwen3 folder (the PyTorch backend's checks).

    Raises:
        FileNotFoundError, BadModelFolder: as :func:`load_config`.
        UnsupportedModel: an architecture or setting the decoder does not implement, in one line
            naming what is supported.
    """
    return decoder_config(load_config(folder), f"model {str(folder)!r}", strict)


def decoder_config(config: PreTrainedConfig, where: str, strict: bool = True) -> DecoderConfig:
    """:func:`read_config` of a configuration transformers has read (``where`` names its folder in
    the errors)."""
    kind = config.model_type
    if kind not in ARCHITECTURES:
        raise UnsupportedModel(f"{where} is a {kind!r} model; the JAX backend supports "
                               f"{', '.join(f'{k} ({v})' for k, v in ARCHITECTURES.items())}")
    if strict and (getattr(config, "hidden_act", "silu") or "silu") != "silu":
        raise UnsupportedModel(f"{where}: activation {config.hidden_act!r} is not implemented (silu only)")
    layer_types = getattr(config, "layer_types", None) or []
    if strict and (getattr(config, "use_sliding_window", False) or any(t != "full_attention" for t in layer_types)):
        raise UnsupportedModel(f"{where}: sliding-window attention is not implemented by the JAX decoder "
                               "(full attention only)")
    theta, rope_type, scaling = _rope(config, where, strict)
    heads = int(config.num_attention_heads)
    bias = bool(getattr(config, "attention_bias", False))
    return DecoderConfig(
        model_type=kind, vocab_size=int(config.vocab_size), hidden_size=int(config.hidden_size),
        intermediate_size=int(config.intermediate_size), num_layers=int(config.num_hidden_layers),
        num_heads=heads, num_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads),
        rms_norm_eps=float(config.rms_norm_eps), rope_theta=theta, rope_type=rope_type, rope_scaling=scaling,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        qkv_bias=True if kind == "qwen2" else bias, o_bias=False if kind == "qwen2" else bias,
        mlp_bias=bool(getattr(config, "mlp_bias", False)) if kind == "llama" else False, qk_norm=kind == "qwen3",
        max_position_embeddings=int(getattr(config, "max_position_embeddings", None) or 0))


# ---------------------------------------------------------------------------------------- tensors
def layer_tensors(c: DecoderConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each decoder layer's tensors (names after ``model.layers.K.``) -> (the shape ``c`` implies,
    the config fields that imply it), in transformers' [out, in] layout."""
    d, hd = f"hidden_size {c.hidden_size}", f"head_dim {c.head_dim}"
    derived = (f"; head_dim = hidden_size / num_attention_heads {c.num_heads}"
               if c.head_dim * c.num_heads == c.hidden_size else "")
    q = (c.num_heads * c.head_dim, f"num_attention_heads {c.num_heads} x {hd}")
    kv = (c.num_kv_heads * c.head_dim, f"num_key_value_heads {c.num_kv_heads} x {hd}")
    inner = (c.intermediate_size, f"intermediate_size {c.intermediate_size}")
    out: dict[str, tuple[tuple[int, ...], str]] = {"input_layernorm.weight": ((c.hidden_size,), d),
                                                   "post_attention_layernorm.weight": ((c.hidden_size,), d)}
    for proj, (rows, why), bias in (("q_proj", q, c.qkv_bias), ("k_proj", kv, c.qkv_bias),
                                    ("v_proj", kv, c.qkv_bias)):
        out[f"self_attn.{proj}.weight"] = ((rows, c.hidden_size), f"{why}, {d}{derived}")
        if bias:
            out[f"self_attn.{proj}.bias"] = ((rows,), why + derived)
    out["self_attn.o_proj.weight"] = ((c.hidden_size, q[0]), f"{d}, {q[1]}{derived}")
    if c.o_bias:
        out["self_attn.o_proj.bias"] = ((c.hidden_size,), d)
    for proj, shape, why in (("gate_proj", (inner[0], c.hidden_size), f"{inner[1]}, {d}"),
                             ("up_proj", (inner[0], c.hidden_size), f"{inner[1]}, {d}"),
                             ("down_proj", (c.hidden_size, inner[0]), f"{d}, {inner[1]}")):
        out[f"mlp.{proj}.weight"] = (shape, why)
        if c.mlp_bias:
            out[f"mlp.{proj}.bias"] = ((shape[0],), why.split(",")[0])
    if c.qk_norm:
        out["self_attn.q_norm.weight"] = out["self_attn.k_norm.weight"] = ((c.head_dim,), hd + derived)
    return out


def decoder_tensors(c: DecoderConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor ``c`` implies but the LM head (:func:`tied_head`), by its name in the weights
    -> (shape, the config fields that imply it): the embeddings, every layer's
    (:func:`layer_tensors`), the final norm."""
    out = {EMBED: ((c.vocab_size, c.hidden_size), f"vocab_size {c.vocab_size}, hidden_size {c.hidden_size}")}
    for i in range(c.num_layers):
        out.update({f"model.layers.{i}.{name}": spec for name, spec in layer_tensors(c).items()})
    out["model.norm.weight"] = ((c.hidden_size,), f"hidden_size {c.hidden_size}")
    return out


def tied_head(tie_word_embeddings: bool, stored: Container[str], equal: Callable[[], bool]) -> bool:
    """Whether the LM head is the token embedding matrix, as transformers 5 decides when it loads
    (``PreTrainedModel.tie_weights``): tied when the config says so, unless the weights hold both
    an embedding and an ``lm_head.weight`` whose values differ (``equal()`` is False: transformers
    then keeps both and warns); a tied head with only ``lm_head.weight`` stored is the embedding too.

    Raises:
        BadModelFolder: the config unties the head (``tie_word_embeddings`` false) and the weights
            hold no ``lm_head.weight``: transformers would start the head at random.
    """
    if not tie_word_embeddings:
        if HEAD not in stored:
            raise BadModelFolder(f"config.json: tie_word_embeddings is false, but the weights hold no {HEAD} "
                                 "(transformers would start the LM head at random; set tie_word_embeddings to "
                                 "true if the head is the embedding matrix)")
        return False
    return not (EMBED in stored and HEAD in stored and not equal())


def generation_eos(folder: str | os.PathLike) -> list[int]:
    """The end-of-sequence ids of a folder's generation config as transformers reads it
    (``GenerationConfig.from_pretrained``): ``generation_config.json``, or ``config.json``'s own
    when that file is missing or unreadable (transformers ignores a malformed one)."""
    from transformers import GenerationConfig

    try:
        value = GenerationConfig.from_pretrained(str(folder), local_files_only=True).eos_token_id
    except OSError:
        value = getattr(load_config(folder), "eos_token_id", None)
    return [value] if isinstance(value, int) else [int(v) for v in value or []]


__all__ = ["ARCHITECTURES", "EMBED", "HEAD", "ROPE_TYPES", "BadModelFolder", "DecoderConfig", "UnsupportedModel",
           "decoder_config", "decoder_tensors", "generation_eos", "layer_tensors", "load_config", "read_config",
           "read_json", "tied_head"]
