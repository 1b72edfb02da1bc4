"""The one device and dtype rule of the project: where a backbone loads, and what ``dtype="auto"``
means there.

``--device`` is ``auto`` (CUDA when torch sees a GPU, else the CPU), ``cpu``, ``cuda`` or
``cuda:N``; :func:`resolve_device` checks it before anything loads.

``"auto"`` is bfloat16 where bfloat16 matmuls are native: on CUDA (float16 on GPUs without
bfloat16), and on CPUs with AVX512-BF16 or AMX instructions (torch's own CPU capability
queries). Everywhere else it is float32: on AVX2-only CPUs oneDNN emulates bfloat16, and a
SmolLM2 forward of 520 tokens took 7.5 s in bfloat16 against 1.6 s in float32 (measured on this
project's AMD EPYC machines). The CLI records :func:`dtype_name` in every results line before the
backbone loads, and the backend loads with :func:`resolve_dtype`; both go through
:func:`native_bfloat16`, so the recorded and the used dtype cannot disagree.

Imports torch; must not import the agents or the environments.
"""

from __future__ import annotations

import re

import torch

#: Accepted ``dtype`` spellings.
DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
}


#: Accepted ``device`` spellings besides ``cuda:N``.
DEVICES = ("auto", "cpu", "cuda")


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def parse_device(device: str | torch.device | None = None) -> torch.device:
    """The torch device named by ``device``, without asking which GPUs exist: ``None``/``"auto"`` is
    :func:`default_device`; ``"cpu"``, ``"cuda"`` and ``"cuda:N"`` as written.

    Raises:
        ValueError: another name.
    """
    name = "auto" if device is None else str(device).strip().lower()
    if name == "auto":
        return default_device()
    if name not in DEVICES and not re.fullmatch(r"cuda:\d+", name):
        raise ValueError(f"device={device!r} is not one of auto, cpu, cuda, cuda:N")
    return torch.device(name)


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """:func:`parse_device`, checked against the GPUs torch sees (where a backbone loads); ``"cuda"``
    becomes the current CUDA device (``cuda:0`` unless changed).

    Raises:
        ValueError: an unknown name, or a CUDA device this machine does not have (one line).
    """
    dev = parse_device(device)
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device={str(dev)!r}: torch sees no CUDA GPU here (a CPU-only torch build, or no "
                             "driver); use --device cpu, or install a CUDA build of torch")
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"device={str(dev)!r}: torch sees {count} CUDA GPU(s), numbered 0 to {count - 1}")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def device_name(device: str | torch.device | None = None) -> str:
    """:func:`parse_device` as the name recorded and passed on (``"cpu"``, ``"cuda"``, ``"cuda:1"``)."""
    return str(parse_device(device))


def native_bfloat16(device: str | torch.device = "cpu") -> bool:
    """Whether bfloat16 matmuls are native on ``device``: a CUDA GPU with bfloat16 support, or a
    CPU with AVX512-BF16 or AMX (emulated bfloat16 on other CPUs is several times slower)."""
    if torch.device(device).type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    cpu = getattr(torch, "cpu", None)
    checks = [getattr(cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    try:
        return any(bool(check()) for check in checks if check is not None)
    except RuntimeError:
        return False


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device | None = None) -> torch.dtype:
    """Map ``"auto"``/``"bfloat16"``/``"float32"``/``"float16"`` (or a torch dtype) to a torch dtype.

    ``"auto"``: bfloat16 where :func:`native_bfloat16`, float16 on a CUDA GPU without bfloat16,
    float32 on other CPUs. ``device``: as :func:`parse_device` (default ``"auto"``).

    Raises:
        ValueError: an unknown name or device.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if str(dtype).lower() == "auto":
        device = parse_device(device)
        if native_bfloat16(device):
            return torch.bfloat16
        return torch.float16 if device.type == "cuda" else torch.float32
    try:
        return DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"dtype={dtype!r} is not 'auto' or one of {sorted(DTYPES)}") from None


def dtype_name(dtype: str | torch.dtype, device: str | torch.device | None = None) -> str:
    """:func:`resolve_dtype` as the name recorded in results and concepts (``"bfloat16"``, ``"float32"``)."""
    from agent_shell.lm.protocol import dtype_text

    return dtype_text(resolve_dtype(dtype, device))


__all__ = ["DEVICES", "DTYPES", "default_device", "device_name", "dtype_name", "native_bfloat16", "parse_device",
           "resolve_device", "resolve_dtype"]
