"""A one-axis device mesh and the layout of arrays over it (``jax.sharding``), so that one jitted
program runs the same on one device and on several: its inputs are placed with a
:class:`jax.sharding.NamedSharding` (one array axis split over the mesh, or none) and XLA
partitions the program, inserting the collectives (an all-reduce where a split axis is summed).
One device is the mesh of size one: the same code path, every array whole on it.

The devices are named as ``devices``: None (the default device: ``jax.default_device``'s, else
this host's first device), a count n (the first n of ``jax.devices()``), a sequence of
``jax.Device`` or a ``jax.sharding.Mesh`` (its devices in order, on one axis). Simulated CPU
devices for tests: ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` set before JAX starts.

Imports nothing else of this project; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = ["AXIS", "Devices", "device_mesh", "padded_size", "put", "repeat_first", "sharding"]

#: the mesh's one axis name
AXIS = "model"

#: Where a fit runs (the module's docstring): None, a count, a sequence of devices or a mesh.
Devices = int | Sequence[jax.Device] | Mesh | None


def _default_device() -> jax.Device:
    device = jax.config.jax_default_device  # set by ``with jax.default_device(...)``
    if isinstance(device, str):
        return jax.devices(device)[0]
    return device if device is not None else jax.local_devices()[0]  # this host's, over several hosts


def device_mesh(devices: Devices = None) -> Mesh:
    """The 1-D mesh (axis :data:`AXIS`) over ``devices`` (see the module's docstring).

    Raises:
        ValueError: one line: more devices asked than present (naming how many are, and the flag
            that simulates CPU devices), a count < 1, an empty sequence, an entry that is no
            ``jax.Device``, a device named twice, devices of different platforms.
    """
    if devices is None:
        return Mesh(np.array([_default_device()]), (AXIS,))
    if isinstance(devices, Mesh):
        devices = list(devices.devices.flat)
    elif isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
        present = jax.devices()
        if devices < 1:
            raise ValueError(f"devices must be at least 1, got {devices}")
        if devices > len(present):
            hint = (" (simulated CPU devices: XLA_FLAGS=--xla_force_host_platform_device_count=N, set before JAX"
                    " starts)" if present[0].platform == "cpu" else "")
            raise ValueError(f"devices={devices}: only {len(present)} {present[0].platform} device"
                             f"{'s are' if len(present) > 1 else ' is'} present{hint}")
        devices = present[:devices]
    elif not isinstance(devices, Sequence) or not devices:
        raise ValueError(f"devices must be None, a count, a non-empty sequence of jax.Device or a Mesh, "
                         f"got {devices!r}")
    devices = list(devices)
    for d in devices:
        if not isinstance(d, jax.Device):
            raise ValueError(f"devices must hold jax.Device entries, got {type(d).__name__} {d!r}")
    if len({d.id for d in devices}) < len(devices):
        raise ValueError(f"devices names a device twice: {[str(d) for d in devices]}")
    if len({d.platform for d in devices}) > 1:
        raise ValueError(f"devices mix platforms: {sorted({d.platform for d in devices})}")
    return Mesh(np.array(devices), (AXIS,))


def padded_size(n: int, mesh: Mesh | int) -> int:
    """The least multiple of the mesh's size (or of ``mesh``, a count) that is >= n: the length of
    an axis split over the mesh."""
    size = mesh if isinstance(mesh, int) else mesh.size
    return -(-n // size) * size


def repeat_first(x: np.ndarray | None, size: int, axis: int = 1) -> np.ndarray | None:
    """``x`` with its ``axis`` padded to length ``size`` by copies of its first entry (slots
    whose results are dropped: a copy computes what the first does, in step with it); None stays
    None."""
    if x is None:
        return None
    return np.concatenate([x] + [np.take(x, [0], axis=axis)] * (size - x.shape[axis]), axis=axis)


def sharding(mesh: Mesh, ndim: int, axis: int | None = None) -> NamedSharding:
    """An ``ndim``-dimensional array's sharding: its ``axis`` split over the mesh (its length a
    multiple of the mesh's size), None: whole on every device (replicated)."""
    spec = [None] * ndim
    if axis is not None:
        spec[axis] = AXIS
    return NamedSharding(mesh, PartitionSpec(*spec))


def put(tree, mesh: Mesh, axis: int | None = None):
    """Every array leaf of ``tree`` placed on the mesh with its ``axis`` split (None: replicated;
    scalars are always replicated): ``jax.device_put`` with :func:`sharding`."""
    def one(x):
        x = np.asarray(x) if not isinstance(x, jax.Array) else x
        return jax.device_put(x, sharding(mesh, x.ndim, axis if x.ndim else None))

    return jax.tree_util.tree_map(one, tree)
