"""Where the JAX backend's weights live and in which dtype: the ``--device`` and ``--dtype`` names
of ``--model jax:`` resolved against the devices JAX sees, ``"auto"`` by the project's one dtype
rule (:func:`agent_shell.lm.dtypes.resolve_dtype`: bfloat16 where its products are native).

Must not import the agents, the environments or torch (the dtype rule's CPU query excepted, imported
when ``"auto"`` is resolved on a CPU).
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from agent_shell.lm.jax_platforms import check_jax_platforms


def resolve_jax_device(device: str | None = None) -> jax.Device:
    """The JAX device named by ``device``: None/``"auto"`` (JAX's default device), ``"cpu"``,
    ``"cuda"``/``"gpu"``, ``"tpu"``, each optionally ``:N``.

    Raises:
        ValueError: another name, a device JAX does not see here (one line listing what it sees),
            or a ``JAX_PLATFORMS`` setting JAX cannot start
            (:func:`agent_shell.lm.jax_platforms.check_jax_platforms`).
    """
    check_jax_platforms()
    name = "auto" if device is None else str(device).strip().lower()
    if name == "auto":
        return jax.devices()[0]
    kind, _, index = name.partition(":")
    platform = {"cuda": "gpu", "gpu": "gpu", "cpu": "cpu", "tpu": "tpu"}.get(kind)
    if platform is None or (index and not index.isdigit()):
        raise ValueError(f"device={device!r} is not one of auto, cpu, cuda, gpu, tpu (optionally :N)")
    try:
        found = jax.devices(platform)
    except RuntimeError:
        found = []
    seen = ", ".join(sorted({str(d.platform) for d in jax.devices()}))
    if not found:
        raise ValueError(f"device={device!r}: JAX sees no {platform} device here (it sees: {seen})")
    k = int(index or 0)
    if k >= len(found):
        raise ValueError(f"device={device!r}: JAX sees {len(found)} {platform} device(s), numbered 0 to "
                         f"{len(found) - 1}")
    return found[k]


def jax_device_name(device: str | None = None) -> str:
    """:func:`resolve_jax_device` as the name recorded and passed on: ``"cpu"``, ``"cuda"``,
    ``"tpu"``, with ``":N"`` past the first device of a kind (``"auto"`` becomes the kind JAX
    uses by default).

    Raises:
        ValueError: as :func:`resolve_jax_device`.
    """
    found = resolve_jax_device(device)
    kind = {"gpu": "cuda"}.get(found.platform, found.platform)
    index = jax.devices(found.platform).index(found)
    return kind if index == 0 else f"{kind}:{index}"


def jax_dtype_name(dtype: str, device: str | None = None) -> str:
    """:func:`resolve_jax_dtype` on the device ``device`` names, as the name recorded in results
    and concepts (``"float32"``, ``"bfloat16"``).

    Raises:
        ValueError: an unknown dtype or device.
    """
    return str(jnp.dtype(resolve_jax_dtype(dtype, resolve_jax_device(device))))


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


__all__ = ["jax_device_name", "jax_dtype_name", "resolve_jax_device", "resolve_jax_dtype"]
