"""Shared fixtures: the real offline SmolLM2-135M-Instruct, loaded once per test run in float32."""

from __future__ import annotations

import pytest

from agent_shell.lm import load_language_model
from agent_shell.lm.hf import HFLanguageModel


@pytest.fixture(scope="session")
def lm32() -> HFLanguageModel:
    """Float32 on CPU (exactness tests)."""
    return load_language_model(None, dtype="float32", device="cpu")


@pytest.fixture()
def fresh(lm32: HFLanguageModel):
    """A factory of backends sharing ``lm32``'s weights but with their own (empty) caches."""

    def make(**kwargs) -> HFLanguageModel:
        kwargs.setdefault("name", lm32.name)
        return HFLanguageModel(lm32.model, lm32.tokenizer, **kwargs)

    return make
