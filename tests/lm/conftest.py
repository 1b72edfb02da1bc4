"""Shared fixtures: the real offline SmolLM2-135M-Instruct, loaded once per test run in float32.

The backbone is shared by every test that asks for it, so a test that changed it in place would
make later tests depend on the order they run in: :func:`shared_backbone_unchanged` fails the
test that changes it, instead of a later one."""

from __future__ import annotations

import pytest
import torch

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


def shared_state(lm: HFLanguageModel) -> dict[str, object]:
    """What a test could change in place on the shared backbone, and torch's process-wide settings
    its numbers depend on (an in-place write to a weight bumps that tensor's version counter)."""
    model, tokenizer = lm.model, lm.tokenizer
    return {
        "weights": tuple(p._version for p in model.parameters()),
        "attention implementation": model.config._attn_implementation,
        "generation config": model.generation_config.to_json_string(),
        "training mode": model.training,
        "chat template": tokenizer.chat_template,
        "tokenizer special tokens": tuple(sorted((i, t.content) for i, t in tokenizer.added_tokens_decoder.items())),
        "tokenizer padding side": tokenizer.padding_side,
        "torch default dtype": torch.get_default_dtype(),
        "torch grad mode": torch.is_grad_enabled(),
    }


@pytest.fixture(autouse=True)
def shared_backbone_unchanged(request: pytest.FixtureRequest):
    """Fail a test (at its teardown) that changed the shared backbone or torch's settings."""
    if "lm32" not in request.fixturenames:
        yield
        return
    lm = request.getfixturevalue("lm32")
    before = shared_state(lm)
    yield
    after = shared_state(lm)
    changed = [key for key in before if before[key] != after[key]]
    assert not changed, f"the test changed the shared backbone's {', '.join(changed)}: later tests would see it"
