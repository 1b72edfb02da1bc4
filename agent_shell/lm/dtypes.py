"""The one dtype rule of the project: what ``dtype="auto"`` means on this machine.

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


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


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
    float32 on other CPUs. ``device`` defaults to :func:`default_device`.

    Raises:
        ValueError: an unknown name.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if str(dtype).lower() == "auto":
        device = torch.device(device) if device is not None else default_device()
        if native_bfloat16(device):
            return torch.bfloat16
        return torch.float16 if device.type == "cuda" else torch.float32
    try:
        return DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"dtype={dtype!r} is not 'auto' or one of {sorted(DTYPES)}") from None


def dtype_name(dtype: str | torch.dtype, device: str | torch.device | None = None) -> str:
    """:func:`resolve_dtype` as the name recorded in results and concepts (``"bfloat16"``, ``"float32"``)."""
    return str(resolve_dtype(dtype, device)).removeprefix("torch.")


__all__ = ["DTYPES", "default_device", "dtype_name", "native_bfloat16", "resolve_dtype"]
