"""Where the JAX backend's weights live and in which dtype: the ``--device`` and ``--dtype`` names
of ``--model jax:`` resolved against the devices JAX sees (one device, or several: a mesh,
:mod:`agent_shell.lm.jax_mesh`), ``"auto"`` by the project's one dtype
rule (:func:`agent_shell.lm.dtypes.resolve_dtype`: bfloat16 where its products are native).

Must not import the agents, the environments or torch (the dtype rule's CPU query excepted, imported
when ``"auto"`` is resolved on a CPU).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from agent_shell.lm.jax_platforms import check_jax_platforms


#: The ``--device`` names of the JAX backend, as the CLI help and the errors print them.
DEVICE_SYNTAX = "auto, KIND or KIND:N (one device), KIND:I-J, KIND:I,J,... or KIND:all (a mesh), KIND one of cpu, cuda, gpu, tpu"

_PLATFORMS = {"cuda": "gpu", "gpu": "gpu", "cpu": "cpu", "tpu": "tpu"}


def _indices(device: str, index: str) -> list[int] | None:
    """The device numbers ``index`` names (``""``, ``N``, ``I-J``, ``I,J,...``; None for ``all``).

    Raises:
        ValueError: anything else, a reversed range or a number named twice.
    """
    if index in ("", "all"):
        return [0] if index == "" else None
    found = re.fullmatch(r"(\d+)-(\d+)|\d+(?:,\d+)*", index)
    if found is None:
        raise ValueError(f"device={device!r} is not one of: {DEVICE_SYNTAX}")
    if found.group(1) is not None:
        first, last = int(found.group(1)), int(found.group(2))
        if first > last:
            raise ValueError(f"device={device!r}: a range runs upward, e.g. {device.split(':')[0]}:{last}-{first}")
        return list(range(first, last + 1))
    numbers = [int(part) for part in index.split(",")]
    if len(set(numbers)) != len(numbers):
        raise ValueError(f"device={device!r} names a device twice")
    return numbers


def resolve_jax_devices(device: str | None = None) -> tuple[jax.Device, ...]:
    """The JAX devices ``device`` names: one device (None/``"auto"``: JAX's default; ``"cpu"``,
    ``"cuda"``/``"gpu"``, ``"tpu"``, each optionally ``:N``, the N-th of its kind) or a mesh of
    several of one kind (``KIND:I-J`` devices I to J, ``KIND:I,J,...``, ``KIND:all``;
    :data:`DEVICE_SYNTAX`). ``cpu:0-7`` needs simulated CPU devices
    (``XLA_FLAGS=--xla_force_host_platform_device_count=8``, set before JAX starts).

    Raises:
        ValueError: another name, a device JAX does not see here (one line listing what it sees),
            or a ``JAX_PLATFORMS`` setting JAX cannot start
            (:func:`agent_shell.lm.jax_platforms.check_jax_platforms`).
    """
    check_jax_platforms()
    name = "auto" if device is None else str(device).strip().lower()
    if name == "auto":
        return (jax.local_devices()[0],)
    kind, _, index = name.partition(":")
    platform = _PLATFORMS.get(kind)
    if platform is None:
        raise ValueError(f"device={device!r} is not one of: {DEVICE_SYNTAX}")
    wanted = _indices(device, index)
    try:
        found = jax.devices(platform)
    except RuntimeError:
        found = []
    if not found:
        seen = ", ".join(sorted({str(d.platform) for d in jax.devices()}))
        raise ValueError(f"device={device!r}: JAX sees no {platform} device here (it sees: {seen})")
    if wanted is None:
        return tuple(found)
    if max(wanted) >= len(found):
        need, hint = max(wanted) + 1, ""
        if len(wanted) == 1 and wanted[0] > 1:  # cpu:8 read as "eight devices"
            need = wanted[0]
            hint = f"; {kind}:{need} is one device (numbered from 0), a mesh of {need} is {kind}:0-{need - 1}"
        if platform == "cpu":
            hint += (f"; simulated CPU devices: XLA_FLAGS=--xla_force_host_platform_device_count={need}, set before "
                     "JAX starts")
        raise ValueError(f"device={device!r}: JAX sees {len(found)} {platform} device(s), numbered 0 to "
                         f"{len(found) - 1}{hint}")
    return tuple(found[k] for k in wanted)


def jax_device_name(device: str | None = None) -> str:
    """:func:`resolve_jax_devices` as the name recorded and passed on: ``"cpu"``, ``"cuda"``,
    ``"tpu"``, with ``":N"`` past the first device of a kind (``"auto"`` becomes the kind JAX
    uses by default); a mesh as ``KIND:I-J`` (consecutive devices) or ``KIND:I,J,...``.

    Raises:
        ValueError: as :func:`resolve_jax_devices`.
    """
    found = resolve_jax_devices(device)
    kind = {"gpu": "cuda"}.get(found[0].platform, found[0].platform)
    of_kind = jax.devices(found[0].platform)
    numbers = [of_kind.index(d) for d in found]
    if len(numbers) == 1:
        return kind if numbers[0] == 0 else f"{kind}:{numbers[0]}"
    if numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{kind}:{numbers[0]}-{numbers[-1]}"
    return f"{kind}:" + ",".join(map(str, numbers))


def jax_dtype_name(dtype: str, device: str | None = None) -> str:
    """:func:`resolve_jax_dtype` on the device ``device`` names, as the name recorded in results
    and concepts (``"float32"``, ``"bfloat16"``).

    Raises:
        ValueError: an unknown dtype or device.
    """
    return str(jnp.dtype(resolve_jax_dtype(dtype, resolve_jax_devices(device)[0])))


def resolve_jax_dtype(dtype: str, device: jax.Device) -> DTypeLike:
    """``"auto"``, ``"float32"``/``"fp32"`` or ``"bfloat16"``/``"bf16"`` as a JAX dtype on ``device``.

    ``"auto"`` follows :func:`agent_shell.lm.dtypes.resolve_dtype`: bfloat16 on GPUs and TPUs and
    on CPUs with native bfloat16 matmuls (:func:`agent_shell.lm.dtypes.native_bfloat16`), float32
    on other CPUs.

    Raises:
        ValueError: another name (float16 is not offered: the decoder runs float32 or bfloat16).
    """
    from agent_shell.lm.protocol import dtype_text

    name = dtype_text(dtype)
    if name == "auto":
        if device.platform != "cpu":
            return jnp.bfloat16
        from agent_shell.lm.dtypes import native_bfloat16

        return jnp.bfloat16 if native_bfloat16("cpu") else jnp.float32
    named = {"float32": jnp.float32, "fp32": jnp.float32, "bfloat16": jnp.bfloat16, "bf16": jnp.bfloat16}
    if name not in named:
        raise ValueError(f"dtype={dtype!r} is not 'auto', 'float32' or 'bfloat16' (the JAX backend's dtypes)")
    return named[name]


__all__ = ["DEVICE_SYNTAX", "jax_device_name", "jax_dtype_name", "resolve_jax_devices", "resolve_jax_dtype"]
