"""The plan on paper: per-device bytes of a decoder's weights and KV cache on a tensor-parallel mesh.

A plan, not a measurement: nothing is loaded onto a device and the mesh itself is not built yet.
From a Llama, Qwen2 or Qwen3 ``config.json`` (read by transformers through the project's own
reading, :func:`agent_shell.lm.model_config.decoder_config`; the tensors and shapes the config
implies are :func:`~agent_shell.lm.model_config.decoder_tensors`'), each tensor's bytes on one
device of a mesh of ``n`` devices under the tensor-parallel layout (:func:`sharded_axis`):

* the attention heads (``q_proj`` rows, ``o_proj`` columns) and the key/value heads (``k_proj``,
  ``v_proj`` rows) split over the mesh, so ``num_attention_heads`` and ``num_key_value_heads``
  must each be a multiple of ``n`` (a head is never cut);
* the MLP's hidden axis (``gate_proj``, ``up_proj`` rows, ``down_proj`` columns): ``intermediate_size``
  a multiple of ``n``;
* the vocabulary axis of the token embeddings and of the LM head: ``vocab_size`` a multiple of ``n``
  (a tied head is the embedding matrix, counted once);
* the norms (and the output projections' biases, whose axis is the hidden size) replicated;
* the KV cache sharded like the key/value heads: keys and values [L, batch, Hkv / n, C, head_dim],
  C the JAX backend's buffer capacity for the context (:func:`agent_shell.lm.buckets.capacity`: a
  power of two, at least 4,096 slots).

A plan fits when weights + KV cache per device stay within the device's memory less the headroom
(:data:`HEADROOM`, a stated allowance for activations, the compiler's workspace and the runtime's
own reservation, not a measurement). A head count (or hidden or vocabulary size) that does not
divide the mesh is refused, naming the counts; so is a plan larger than the budget, naming the
bytes. The device memories (:data:`DEVICES`) are the vendors' nominal capacities taken as 10^9
bytes per GB, at or below what the runtimes report.

Usage::

    python benchmarks/mesh_plan.py --config path/to/config.json --mesh 8 --context 4096 --batch 1 \\
        --dtype bfloat16 --device-memory 80GB
    python benchmarks/mesh_plan.py --model qwen3-32b --device v5e-8 --context 8192 --batch 8
    python benchmarks/mesh_plan.py --table --context 8192 --batch 8 --out results/mesh_plan.json

``--table`` prints the Markdown table of docs/mesh-plan.md (every model of :data:`MODELS` on every
device of :data:`DEVICES`); ``--out`` writes the plans as JSON (full precision). Exit status 0
when every plan printed fits, 1 when one is refused, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from agent_shell.lm.buckets import capacity
from agent_shell.lm.model_config import EMBED, HEAD, DecoderConfig, decoder_config, decoder_tensors, read_json
from cb_io.storage import write_bytes_atomic

#: Bytes per element of the dtypes a backbone loads in.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
#: The share of a device's memory kept free for what the plan does not count: one pass's
#: activations (they grow with the tokens of a pass), XLA's workspace and the runtime's reservation.
HEADROOM = 0.10

#: What the four Qwen3 dense models below share: full attention, head_dim 128, 8 key/value heads.
_QWEN3 = {"model_type": "qwen3", "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936}
#: The Qwen3 dense models' public ``config.json`` figures (the fields the plan reads).
MODELS: dict[str, dict] = {
    "qwen3-4b": {**_QWEN3, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "tie_word_embeddings": True},
    "qwen3-8b": {**_QWEN3, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "tie_word_embeddings": False},
    "qwen3-14b": {**_QWEN3, "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 40,
                  "num_attention_heads": 40, "tie_word_embeddings": False},
    "qwen3-32b": {**_QWEN3, "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
                  "num_attention_heads": 64, "tie_word_embeddings": False},
}


@dataclass(frozen=True)
class Device:
    """A machine's accelerators as one mesh: ``devices`` of ``memory`` bytes each (JAX sees one
    device per TPU v5p chip, its two TensorCores as one)."""

    name: str
    devices: int
    memory: int


#: The machines of the docs table: the vendors' nominal memory per device, 10^9 bytes per GB
#: (a TPU slice's name counts TensorCores on v5p, chips on v5e).
DEVICES: dict[str, Device] = {
    "h100": Device("one H100 80 GB", 1, 80 * 10**9),
    "2xh100": Device("two H100 80 GB", 2, 80 * 10**9),
    "v5e-8": Device("TPU v5e-8 (8 chips, 16 GB each)", 8, 16 * 10**9),
    "v5p-8": Device("TPU v5p-8 (4 chips, 95 GB each)", 4, 95 * 10**9),
    "v5e-16": Device("TPU v5e-16 (16 chips, 16 GB each)", 16, 16 * 10**9),
}

#: The config counts a split axis must divide -> their names in :class:`DecoderConfig`.
_COUNTS = {"num_attention_heads": "num_heads", "num_key_value_heads": "num_kv_heads",
           "intermediate_size": "intermediate_size", "vocab_size": "vocab_size"}


def sharded_axis(name: str) -> tuple[int, str] | None:
    """The layout of one tensor (its name in the weights, transformers' [out, in] layout): (the axis
    split over the mesh, the config count that must divide the mesh), or None for a replicated one.

    Raises:
        ValueError: a tensor the layout does not place (an architecture it does not cover).
    """
    if name.endswith("norm.weight"):
        return None
    if name in (EMBED, HEAD):
        return 0, "vocab_size"
    match = re.search(r"\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.(weight|bias)$", name)
    if match is None:
        raise ValueError(f"{name}: the tensor-parallel layout does not place this tensor")
    proj, kind = match.groups()
    if proj in ("o_proj", "down_proj"):  # rows are the hidden size: the input axis is split, a bias replicated
        return (1, "num_attention_heads" if proj == "o_proj" else "intermediate_size") if kind == "weight" else None
    return 0, {"q_proj": "num_attention_heads", "k_proj": "num_key_value_heads",
               "v_proj": "num_key_value_heads"}.get(proj, "intermediate_size")


@dataclass(frozen=True)
class Plan:
    """One model on one mesh at one context and batch.

    Attributes:
        parameters: the whole model's parameters (a tied head counted once).
        parameters_per_device: the parameters one device holds (None when the layout is refused).
        weight_bytes, kv_bytes: bytes per device of the weights and of the KV cache (None when refused).
        kv_slots: the KV buffer's slots per sequence (the context rounded up to a capacity).
        budget: the bytes a device offers the plan (memory less the headroom).
        largest_context: the most slots a sequence's KV buffer may hold with the weights in the
            budget (a capacity, 0 when none does; None when the layout is refused).
        refused: why not, one line per reason; empty when the plan fits.
    """

    model: str
    mesh: int
    dtype: str
    context: int
    batch: int
    kv_slots: int
    device_memory: int
    headroom: float
    budget: int
    parameters: int
    parameters_per_device: int | None
    weight_bytes: int | None
    kv_bytes: int | None
    largest_context: int | None
    refused: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return not self.refused


def parameters(c: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Every stored tensor's shape, the LM head included unless it is the (tied) embedding matrix."""
    shapes = {name: shape for name, (shape, _) in decoder_tensors(c).items()}
    if not c.tie_word_embeddings:
        shapes[HEAD] = shapes[EMBED]
    return shapes


def kv_bytes_per_token(c: DecoderConfig, dtype: str) -> int:
    """Bytes of one token's keys and values over all layers, on one device of a mesh of one."""
    return 2 * c.num_layers * c.num_kv_heads * c.head_dim * DTYPE_BYTES[dtype]


def plan(c: DecoderConfig, model: str, mesh: int, context: int, batch: int, dtype: str, device_memory: int,
         headroom: float = HEADROOM) -> Plan:
    """The :class:`Plan` of ``c`` on ``mesh`` devices of ``device_memory`` bytes.

    Raises:
        ValueError: a mesh, context or batch below 1, an unknown dtype, a headroom outside [0, 1).
    """
    if mesh < 1 or context < 1 or batch < 1:
        raise ValueError(f"mesh {mesh}, context {context} and batch {batch} must each be at least 1")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r}: one of {', '.join(DTYPE_BYTES)}")
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom {headroom}: a share of the memory in [0, 1)")
    shapes = parameters(c)
    total = sum(math.prod(s) for s in shapes.values())
    budget = int(device_memory * (1 - headroom))
    slots = capacity(context)
    counts = {field: getattr(c, attr) for field, attr in _COUNTS.items()}
    split = {layout[1] for name in shapes if (layout := sharded_axis(name))}
    indivisible = [f"{field} {counts[field]} is not a multiple of the mesh's {mesh} devices"
                   for field in _COUNTS if field in split and counts[field] % mesh]
    common = dict(model=model, mesh=mesh, dtype=dtype, context=context, batch=batch, kv_slots=slots,
                  device_memory=device_memory, headroom=headroom, budget=budget, parameters=total)
    if indivisible:
        return Plan(**common, parameters_per_device=None, weight_bytes=None, kv_bytes=None, largest_context=None,
                    refused=tuple(indivisible))
    per_device = sum(math.prod(s) // (mesh if sharded_axis(name) else 1) for name, s in shapes.items())
    weights = per_device * DTYPE_BYTES[dtype]
    per_slot = kv_bytes_per_token(c, dtype) // mesh * batch
    kv = per_slot * slots
    largest, free = 0, budget - weights
    while capacity(largest + 1) * per_slot <= free:
        largest = capacity(largest + 1)
    refused = () if weights + kv <= budget else (
        f"weights {_gb(weights)} + KV cache {_gb(kv)} = {_gb(weights + kv)} per device exceed the budget "
        f"{_gb(budget)} ({_gb(device_memory)} less {headroom:.0%} headroom)",)
    return Plan(**common, parameters_per_device=per_device, weight_bytes=weights, kv_bytes=kv,
                largest_context=largest, refused=refused)


def _gb(n: int) -> str:
    """Bytes as GB (10^9), 4 significant digits."""
    return f"{n / 1e9:.4g} GB"


def read_decoder(source: str) -> tuple[str, DecoderConfig]:
    """(a name, the decoder's settings) of a ``config.json`` file, a model folder or a name in
    :data:`MODELS`, read by transformers (shapes only: ``strict=False``).

    Raises:
        FileNotFoundError: no such file, folder or name.
        agent_shell.lm.model_config.BadModelFolder: the file is not a JSON object.
        agent_shell.lm.model_config.UnsupportedModel: not a Llama, Qwen2 or Qwen3 model.
    """
    from transformers import AutoConfig

    if source in MODELS:
        raw, name = MODELS[source], source
    else:
        path = Path(source)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(f"{source!r} is no config.json, model folder or model name "
                                    f"({', '.join(MODELS)})")
        raw, name = read_json(path), str(path)
    kind = raw.get("model_type")
    try:
        config = AutoConfig.for_model(kind, **{k: v for k, v in raw.items() if k != "model_type"})
    except (ValueError, KeyError, TypeError):
        config = None
    if config is None:
        from agent_shell.lm.model_config import ARCHITECTURES, UnsupportedModel
        raise UnsupportedModel(f"{name}: model_type {kind!r}; the plan covers {', '.join(ARCHITECTURES)}")
    return name, decoder_config(config, name, strict=False)


def parse_bytes(text: str) -> int:
    """``80GB``, ``16GiB``, ``95e9`` or a plain byte count as bytes.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*(GiB|GB|MiB|MB|)\s*", text)
    units = {"": 1, "MB": 10**6, "GB": 10**9, "MiB": 2**20, "GiB": 2**30}
    try:
        value = float(match.group(1)) * units[match.group(2)] if match else -1.0
    except ValueError:
        value = -1.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a memory size such as 80GB, 16GiB or 95e9 (bytes)")
    return int(value)


def row(p: Plan, device: str) -> str:
    """One line of the docs table."""
    if p.weight_bytes is None:
        return f"| {p.model} | {device} | {p.mesh} | refused | refused | no | {'; '.join(p.refused)} |"
    room = (f"room for {p.largest_context:,} KV slots x {p.batch}" if p.largest_context
            else "no room for a KV buffer")
    why = (f"{_gb(p.weight_bytes + p.kv_bytes)} of {_gb(p.budget)}; {room}" if p.fits
           else f"over the budget {_gb(p.budget)} by {_gb(p.weight_bytes + p.kv_bytes - p.budget)}; {room}")
    return (f"| {p.model} | {device} | {p.mesh} | {_gb(p.weight_bytes)} | {_gb(p.kv_bytes)} | "
            f"{'yes' if p.fits else 'no'} | {why} |")


def table(context: int, batch: int, dtype: str, headroom: float = HEADROOM) -> tuple[str, list[Plan]]:
    """The Markdown table of every model of :data:`MODELS` on every machine of :data:`DEVICES`."""
    lines = ["| model | machine | mesh | weights / device | KV cache / device | fits | why |",
             "|---|---|---|---|---|---|---|"]
    plans = []
    for model in MODELS:
        name, c = read_decoder(model)
        for device in DEVICES.values():
            p = plan(c, name, device.devices, context, batch, dtype, device.memory, headroom)
            plans.append(p)
            lines.append(row(p, device.name))
    return "\n".join(lines), plans


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="a config.json, a model folder, or a name: " + ", ".join(MODELS))
    parser.add_argument("--model", help="same as --config")
    parser.add_argument("--mesh", type=int, help="devices in the tensor-parallel mesh (default: --device's)")
    parser.add_argument("--device", choices=sorted(DEVICES), help="a machine of the docs table")
    parser.add_argument("--device-memory", type=parse_bytes, help="memory per device (80GB, 16GiB, bytes)")
    parser.add_argument("--context", type=int, default=8192, help="tokens per sequence (default 8192)")
    parser.add_argument("--batch", type=int, default=1, help="sequences in the cache at once (default 1)")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES))
    parser.add_argument("--headroom", type=float, default=HEADROOM,
                        help=f"share of each device's memory kept free (default {HEADROOM})")
    parser.add_argument("--table", action="store_true", help="the docs table: every model on every machine")
    parser.add_argument("--out", type=Path, help="write the plans as JSON here")
    args = parser.parse_args(argv)
    source = args.config or args.model
    if args.table:
        text, plans = table(args.context, args.batch, args.dtype, args.headroom)
    else:
        if source is None:
            parser.error("pass --config (or --model), or --table")
        device = DEVICES.get(args.device) if args.device else None
        mesh = args.mesh or (device.devices if device else None)
        memory = args.device_memory or (device.memory if device else None)
        if mesh is None or memory is None:
            parser.error("pass --mesh and --device-memory, or --device")
        try:
            name, c = read_decoder(source)
            plans = [plan(c, name, mesh, args.context, args.batch, args.dtype, memory, args.headroom)]
        except (OSError, ValueError) as err:
            print(f"Error: {err}", file=sys.stderr)
            return 2
        p = plans[0]
        text = "\n".join([
            f"{p.model}: {p.parameters:,} parameters, {p.dtype}, mesh of {p.mesh}, context {p.context:,} "
            f"({p.kv_slots:,} KV slots) x batch {p.batch}",
            *([f"  weights {_gb(p.weight_bytes)} ({p.parameters_per_device:,} parameters) and KV cache "
               f"{_gb(p.kv_bytes)} per device; budget {_gb(p.budget)}; room for KV buffers of "
               f"{p.largest_context:,} slots x {p.batch}"]
              if p.weight_bytes is not None else []),
            "  fits" if p.fits else "  refused: " + "; ".join(p.refused)])
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(args.out, (json.dumps([{**asdict(p), "fits": p.fits} for p in plans], indent=1)
                                      + "\n").encode())
    return 0 if all(p.fits for p in plans) else 1


if __name__ == "__main__":
    sys.exit(main())
