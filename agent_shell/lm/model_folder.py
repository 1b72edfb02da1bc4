"""One loading rule of a HuggingFace model folder for both backends: the folder is checked against
its weights before anything loads, and a folder that disagrees with itself is refused in one line.

:func:`check_model_folder` runs in the checks a command makes before anything heavy
(:func:`agent_shell.lm.factory.check_model_source`, before the expert demonstrations are
collected) and again, at no cost, when a backend loads the folder. It reads no tensor: the
configuration comes from transformers (:func:`agent_shell.lm.model_config.load_config`) and every
tensor's shape from the safetensors headers, or, in a folder of PyTorch pickles (``pytorch_model.bin``,
sharded or not: checkpoints saved before safetensors became the default; the PyTorch backend only),
from the pickles memory-mapped onto torch's ``meta`` device (torch is imported for that alone). It
refuses, naming the file, the field and both values:

* a file that is a Git LFS pointer instead of its content, a safetensors file that is truncated or
  not one, an index naming a shard the folder lacks, a ``config.json`` that is not JSON or not a
  causal language model (a multimodal folder);
* a tensor whose shape is not the one the configuration implies (Llama, Qwen2, Qwen3: every
  tensor), a tensor the configuration implies that the weights lack, and an untied LM head
  (``tie_word_embeddings`` false) with no ``lm_head.weight`` (transformers would start it at random);
* a tokenizer with more tokens than the embedding table has rows (ids past the table);
* a pre-quantized folder (``quantization_config`` in ``config.json``: GPTQ, AWQ, bitsandbytes...),
  whose weights are packed integers neither backend computes with, naming the method;
* a window past :data:`agent_shell.lm.tokenized.MAX_WINDOW`, or none at all.

A ``generation_config.json`` transformers cannot read is ignored by both backends, as transformers
ignores it, with one warning line. Weights that are not finite are found when a backend loads them
(:func:`refuse_nonfinite`).

Must not import the agents, the environments or JAX; torch only inside :func:`tensor_shapes`, for
a folder of PyTorch pickles.
"""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from agent_shell.lm.model_config import (ARCHITECTURES, EMBED, HEAD, BadModelFolder, DecoderConfig, decoder_config,
                                         decoder_tensors, load_config, read_json, tied_head)
from agent_shell.lm.tokenized import MAX_WINDOW

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

#: The first bytes of a Git LFS pointer file (what a clone without ``git lfs`` holds instead of a file).
LFS_POINTER = b"version https://git-lfs.github.com/spec/"


def weight_files(folder: str | os.PathLike) -> list[Path]:
    """The safetensors files of a model folder: the shards its ``model.safetensors.index.json``
    names, else every ``*.safetensors`` file (none: an empty list).

    Raises:
        BadModelFolder: the index is not JSON, names no shard, or names a shard the folder lacks.
    """
    return _indexed_files(Path(folder), "model.safetensors.index.json", "*.safetensors")


def pickle_files(folder: str | os.PathLike) -> list[Path]:
    """The PyTorch pickle files of a model folder with no safetensors weights: the shards its
    ``pytorch_model.bin.index.json`` names, else ``pytorch_model.bin`` (none: an empty list).

    Raises:
        BadModelFolder: the index is not JSON, names no shard, or names a shard the folder lacks.
    """
    return _indexed_files(Path(folder), "pytorch_model.bin.index.json", "pytorch_model.bin")


def _indexed_files(folder: Path, index_name: str, pattern: str) -> list[Path]:
    index = folder / index_name
    if not index.is_file():
        return sorted(folder.glob(pattern))
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise BadModelFolder(f"{index} holds no weight_map")
    names = sorted(set(weight_map.values()))
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more of its {len(names)} shards)" if len(missing) > 1 else ""
        raise BadModelFolder(f"{index} names the shard {missing[0]}, which {folder} does not hold{more}")
    return [folder / n for n in names]


def tensor_shapes(folder: str | os.PathLike) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor of a folder's weights -> (its shape, the file's name): read from the safetensors
    files' headers, or, in a folder without them, from its PyTorch pickles (:func:`pickle_files`)
    memory-mapped onto the ``meta`` device (no tensor is loaded either way).

    Raises:
        BadModelFolder: a file is not a whole safetensors file or PyTorch pickle (truncated, or
            something else), or what :func:`weight_files` raises.
    """
    from safetensors import SafetensorError, safe_open

    shapes: dict[str, tuple[tuple[int, ...], str]] = {}
    files = weight_files(folder)
    if not files:
        return _pickle_shapes(pickle_files(folder))
    for path in files:
        refuse_pointer(path)
        try:
            with safe_open(str(path), framework="np") as f:
                for name in f.keys():
                    shapes[name] = (tuple(int(n) for n in f.get_slice(name).get_shape()), path.name)
        except (SafetensorError, OSError) as err:
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise BadModelFolder(f"{path} is not a whole safetensors file ({reason}): fetch it again") from None
    return shapes


def _pickle_shapes(files: list[Path]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor of PyTorch pickle files -> (its shape, the file's name), the tensors mapped
    onto the ``meta`` device (``weights_only``: no code in the pickle runs; ``mmap``: nothing read
    but the pickle's index)."""
    if not files:
        return {}
    import torch

    shapes: dict[str, tuple[tuple[int, ...], str]] = {}
    for path in files:
        refuse_pointer(path)
        try:
            state = torch.load(str(path), map_location="meta", mmap=True, weights_only=True)
        except Exception as err:  # noqa: BLE001 - torch raises RuntimeError, pickle errors, EOFError...
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise BadModelFolder(f"{path} is not a whole PyTorch weights file ({type(err).__name__}: {reason}): "
                                 "fetch it again") from None
        if not isinstance(state, dict):
            raise BadModelFolder(f"{path} holds a {type(state).__name__}, not a state dict of named tensors")
        for name, tensor in state.items():
            if hasattr(tensor, "shape"):
                shapes[str(name)] = (tuple(int(n) for n in tensor.shape), path.name)
    return shapes


def refuse_quantized(folder: Path, raw: Mapping[str, object]) -> None:
    """Refuse a pre-quantized folder (``quantization_config`` in ``config.json``, ``raw``).

    Raises:
        BadModelFolder: one line naming the file, the field and the method.
    """
    quant = raw.get("quantization_config")
    if quant is None:
        return
    method = quant.get("quant_method", "unknown") if isinstance(quant, dict) else quant
    bits = f" {quant['bits']}-bit" if isinstance(quant, dict) and "bits" in quant else ""
    raise BadModelFolder(f"{folder / 'config.json'}: quantization_config says the weights are pre-quantized "
                         f"({method}{bits}): neither backend computes with quantized weights; pass the model's "
                         "unquantized folder (float16, bfloat16 or float32 weights)")


def refuse_pointer(path: Path) -> None:
    """Refuse a file that is a Git LFS pointer (a clone made without ``git lfs``).

    Raises:
        BadModelFolder: ``path`` is one (one line saying how to fetch the content).
    """
    try:
        if path.stat().st_size > 1024:
            return
        with open(path, "rb") as f:
            head = f.read(len(LFS_POINTER))
    except OSError:
        return
    if head == LFS_POINTER:
        raise BadModelFolder(f"{path} is a Git LFS pointer ({path.stat().st_size} bytes), not the file: fetch "
                             "the content (git lfs pull in the clone, or hf download)")


def check_model_folder(folder: str | os.PathLike, backend: str = "hf") -> None:
    """Check a model folder against its weights before anything loads (the module docstring's
    list); done once per folder and content (a second call on unchanged files costs nothing).

    Args:
        folder: the model folder.
        backend: ``"hf"`` (the PyTorch backend: any causal language model transformers loads, the
            shapes checked for the architectures :data:`agent_shell.lm.model_config.ARCHITECTURES`
            names) or ``"jax"`` (those architectures only, safetensors weights only).

    Raises:
        FileNotFoundError: no ``config.json``, or (``jax``) no safetensors weights.
        BadModelFolder: a broken file or a disagreement (one line naming the file, the field and
            both values).
        agent_shell.lm.model_config.UnsupportedModel: (``jax``) what the JAX decoder does not implement.
    """
    folder = Path(folder)
    files = tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()))
    _check(str(folder), backend, files)


@functools.lru_cache(maxsize=64)
def _check(folder_name: str, backend: str, files: tuple) -> None:
    folder = Path(folder_name)
    for name, _, _ in files:
        refuse_pointer(folder / name)
    config = load_config(folder)
    refuse_quantized(folder, read_json(folder / "config.json"))
    decoder = None
    if backend == "jax" or config.model_type in ARCHITECTURES:
        decoder = decoder_config(config, f"model {folder_name!r}", strict=backend == "jax")
    window = getattr(config, "max_position_embeddings", None)
    if window is not None and window > MAX_WINDOW:
        raise BadModelFolder(f"{folder / 'config.json'}: max_position_embeddings is {window:,}, past any window "
                             f"a backbone can use here ({MAX_WINDOW:,} tokens): set it to the model's context length")
    shapes = tensor_shapes(folder)
    if backend == "jax" and not weight_files(folder):
        bins = " (its pytorch_model.bin weights are for the PyTorch backend: drop the jax: prefix, or save "
        "the model with safetensors)" if pickle_files(folder) else ""
        raise FileNotFoundError(f"{folder_name!r} holds no safetensors weights (model.safetensors or an index){bins}")
    if decoder is not None:
        check_tensor_shapes(folder, decoder, shapes)
    _check_tokenizer(folder, config, window)
    generation = folder / "generation_config.json"
    if generation.is_file():
        try:
            read_json(generation)
        except BadModelFolder as err:
            warnings.warn(f"{err}: ignored, as transformers ignores it (the end-of-sequence ids come from "
                          "config.json)", stacklevel=2)


def check_tensor_shapes(where: str | os.PathLike, c: DecoderConfig,
                        shapes: Mapping[str, tuple[tuple[int, ...], str]],
                        equal: Callable[[], bool] = lambda: True) -> bool:
    """Check every tensor ``c`` implies against ``shapes`` (name -> (shape, the file holding it, or
    ``""`` for tensors in memory)), and the LM head as transformers resolves it
    (:func:`agent_shell.lm.model_config.tied_head`; ``equal()``: the stored embeddings and head
    hold the same values). Returns whether the head is tied to the embeddings.

    Raises:
        BadModelFolder: a tensor missing or of another shape (one line naming ``where``'s file, the
            tensor, the config fields and both shapes), or an untied head that is not stored.
    """
    where = Path(where)
    try:
        tied = tied_head(c.tie_word_embeddings, shapes, equal)
    except BadModelFolder as err:
        raise BadModelFolder(f"{where}/{err}") from None
    expected = decoder_tensors(c)
    if tied and EMBED not in shapes and HEAD in shapes:  # transformers ties the embeddings to the stored head
        shapes = {**shapes, EMBED: shapes[HEAD]}
    if not tied:
        expected[HEAD] = ((c.vocab_size, c.hidden_size), f"vocab_size {c.vocab_size}, hidden_size {c.hidden_size}")
    stored = sorted({file for _, file in shapes.values() if file})
    weights = f"the weights ({', '.join(stored)})" if stored else "the weights"
    for name, (shape, why) in expected.items():
        if name not in shapes:
            raise BadModelFolder(f"{where}: {weights} hold no tensor {name}, which config.json implies ({why})")
        found, file = shapes[name]
        if tuple(found) != shape:
            raise BadModelFolder(f"{where / file}: tensor {name} is {list(found)}, but config.json ({why}) "
                                 f"implies {list(shape)}")
    return tied


def _check_tokenizer(folder: Path, config: PreTrainedConfig, window: int | None) -> None:
    """The tokenizer loads, its ids fit the embedding table, and the window is known."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, TypeError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise BadModelFolder(f"{folder}: cannot load its tokenizer ({reason})") from None
    vocab = getattr(config.get_text_config(), "vocab_size", None)
    if vocab is not None and len(tokenizer) > vocab:
        raise BadModelFolder(f"{folder / 'config.json'}: vocab_size is {vocab:,}, but the tokenizer has "
                             f"{len(tokenizer):,} tokens: ids from {vocab:,} on would index past the embedding "
                             "table (pass the folder's own tokenizer, or the model it belongs to)")
    if window is None and not 0 < (getattr(tokenizer, "model_max_length", None) or 0) <= MAX_WINDOW:
        raise BadModelFolder(f"{folder / 'config.json'}: no max_position_embeddings, and the tokenizer gives "
                             "no model_max_length: set max_position_embeddings to the model's context length")


def refuse_nonfinite(folder: str | os.PathLike, counts: Iterable[tuple[str, int]]) -> None:
    """Refuse weights that are not finite: ``counts`` gives (tensor name, how many of its entries
    are NaN or infinite), read by the backend that loaded them; the first nonzero count is refused.

    Raises:
        BadModelFolder: a tensor holds non-finite values (one line naming the folder's file and
            the tensor): no run with these weights can score a candidate.
    """
    for name, bad in counts:
        if bad:
            try:
                where = Path(folder) / tensor_shapes(folder)[name][1]
            except (BadModelFolder, KeyError):
                where = Path(folder)
            raise BadModelFolder(f"{where}: tensor {name} holds {bad:,} non-finite value(s) (NaN or infinity): "
                                 "the backbone's weights are not finite (fetch them again)")


__all__ = ["LFS_POINTER", "check_model_folder", "check_tensor_shapes", "pickle_files", "refuse_nonfinite",
           "refuse_pointer", "refuse_quantized", "tensor_shapes", "weight_files"]
