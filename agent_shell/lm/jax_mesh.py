"""Where the JAX decoder lives: a one-axis device mesh (one device is the mesh of size one, on the
same code path) and the tensor-parallel layout of its weights and key/value buffers on it.

The layout is Megatron's (Shoeybi et al. 2019, "Megatron-LM", Sec. 3), as MaxText and JetStream lay
out Llama-family models with ``jax.sharding``: each device holds

* a contiguous block of the attention heads: the rows of the query, key and value projections
  (and their biases), the matching columns of the output projection, and the same key/value
  heads of the KV buffers ([L, B, Hkv, S, hd] split on Hkv), so a query head reads its key/value
  head on its own device (query head h reads key/value head h // (H / Hkv), and both blocks are
  the device's k-th of n);
* a contiguous block of the MLP's hidden axis (the rows of the gate and up projections, the
  columns of the down projection);
* a block of the vocabulary (the rows of the token embeddings and of an untied LM head), when the
  mesh divides the vocabulary; otherwise these are replicated;
* every norm weight and the rotary frequencies, replicated.

XLA inserts the collectives (an all-reduce after the output and down projections, the
vocabulary's reductions); every program input and record the host builds is replicated, so one
record is fetched as on one device.

Must not import the agents, the environments or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from cb_core.mesh import AXIS, device_mesh, sharding  # the mesh and its one axis, shared with the fits

from agent_shell.lm.model_config import EMBED, HEAD, DecoderConfig

#: Layer tensors (names after ``model.layers.K.``) split on their output rows / input columns.
_ROWS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
_COLUMNS = ("self_attn.o_proj", "mlp.down_proj")


@dataclass(frozen=True)
class Placement:
    """A one-axis mesh of the devices a decoder lives on (:data:`AXIS`), and its shardings.

    Attributes:
        mesh: the ``jax.sharding.Mesh`` (one axis, :data:`AXIS`); a single device is a mesh of one.
    """

    mesh: Mesh

    @classmethod
    def over(cls, devices: Sequence[jax.Device]) -> "Placement":
        """The placement over ``devices`` (in that order; at least one): the fits' mesh
        (:func:`cb_core.mesh.device_mesh`), so a backbone and its concepts' fits share devices.

        Raises:
            ValueError: no device, a device named twice, or devices of more than one platform.
        """
        return cls(device_mesh(list(devices)))

    def local_devices(self) -> list[jax.Device]:
        """The devices of this host (all of them on one host): where this host's fits run."""
        return [d for d in self.devices if d.process_index == jax.process_index()]

    @property
    def size(self) -> int:
        """How many devices."""
        return self.mesh.size

    @property
    def devices(self) -> tuple[jax.Device, ...]:
        """The devices, in mesh order."""
        return tuple(self.mesh.devices.flat)

    @property
    def replicated(self) -> NamedSharding:
        """Every device holds the whole array (program inputs, records, norms, a head's parameters)."""
        return sharding(self.mesh, 0)

    @property
    def kv(self) -> NamedSharding:
        """A key/value buffer [L, B, Hkv, S, hd]: split on its key/value heads."""
        return sharding(self.mesh, 5, axis=2)

    def weight(self, name: str, shape: tuple[int, ...], stacked: bool) -> NamedSharding:
        """The sharding of weight ``name`` (transformers' name, without ``model.layers.K.`` when
        ``stacked``: then ``shape`` has the leading layer axis)."""
        module, _, kind = name.rpartition(".")
        axis = None
        if stacked and module in _ROWS:  # [L, out(, in)]: the output rows
            axis = 1
        elif stacked and module in _COLUMNS and kind == "weight":  # [L, D, in]: the input columns
            axis = 2
        elif name in (EMBED, HEAD) and shape[0] % self.size == 0:  # [V, D]: the vocabulary
            axis = 0
        return sharding(self.mesh, len(shape), axis)


def split_counts(config: DecoderConfig | Mapping[str, Any]) -> dict[str, int]:
    """The sizes a mesh splits, by their ``config.json`` names: of a :class:`DecoderConfig`, or of a
    ``config.json`` read as a dict (no transformers import: ``num_key_value_heads`` defaults to
    ``num_attention_heads``, as transformers defaults it)."""
    if isinstance(config, DecoderConfig):
        return {"num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
                "intermediate_size": config.intermediate_size}
    heads = int(config.get("num_attention_heads", 1))
    return {"num_attention_heads": heads, "num_key_value_heads": int(config.get("num_key_value_heads") or heads),
            "intermediate_size": int(config.get("intermediate_size", 1))}


def check_divides(config: DecoderConfig | Mapping[str, Any], size: int, where: object) -> None:
    """Refuse a mesh of ``size`` devices that does not divide the decoder's split axes
    (:func:`split_counts` of ``config``).

    Raises:
        ValueError: one line naming ``where`` (the model), the counts and the mesh size.
    """
    counts = split_counts(config)
    bad = [f"{name} {value}" for name, value in counts.items() if value % size]
    if bad:
        raise ValueError(f"{where}: a mesh of {size} devices must divide {', '.join(bad)} (the heads and the "
                         f"MLP's hidden axis are split over the devices); pick a mesh size dividing "
                         f"{np.gcd.reduce(list(counts.values()))}")


def place(shape: tuple[int, ...], dtype: np.dtype, sharding: NamedSharding,
          read: Callable[[tuple[slice, ...]], np.ndarray]) -> jax.Array:
    """A ``shape`` array laid out by ``sharding``, each device's block read by ``read(index)`` (a
    tuple of slices into the whole array) and cast to ``dtype`` on the host: no device, and not
    the host, ever holds more of the array than its block."""
    return jax.make_array_from_callback(shape, sharding, lambda index: np.asarray(read(index)).astype(dtype))


def shards_per_device(array: jax.Array) -> dict[jax.Device, tuple[int, ...]]:
    """Each device's block shape of ``array`` (from its addressable shards)."""
    return {s.device: tuple(s.data.shape) for s in array.addressable_shards}


__all__ = ["AXIS", "Placement", "check_divides", "place", "shards_per_device", "split_counts"]
