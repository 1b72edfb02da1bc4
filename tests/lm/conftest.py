"""Shared fixtures: the real offline SmolLM2-135M-Instruct, loaded once per test run in float32
(by the PyTorch backend, ``lm32``, and by the JAX backend, ``jax32``), and tiny random-weight
Llama and Qwen2 models built from configs.

The backbone is shared by every test that asks for it, so a test that changed it in place would
make later tests depend on the order they run in: :func:`shared_backbone_unchanged` fails the
test that changes it, instead of a later one.

Tests parametrised over both backends take ``fresh_any`` (a factory of views of the backend under
test, parametrised ``torch`` / ``jax``) and check it against the PyTorch model's own plain forward
passes; :func:`passes` counts either backend's forward passes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from agent_shell.lm import load_language_model
from agent_shell.lm.hf import HFLanguageModel

#: The backends every exactness test runs on.
BACKENDS = ("torch", "jax")


@pytest.fixture(scope="session")
def lm32() -> HFLanguageModel:
    """Float32 on CPU (exactness tests)."""
    return load_language_model(None, dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def jax32():
    """The same backbone through the JAX backend, float32 on the CPU."""
    return load_language_model("jax:", dtype="float32", device="cpu")


def view(lm: Any, **kwargs: Any) -> Any:
    """A backend of ``lm``'s kind on the same weights (and, for JAX, the same compiled programs)
    with its own, empty caches and the settings ``kwargs``."""
    from agent_shell.lm.jax_backend import JaxLanguageModel

    kwargs.setdefault("name", lm.name)
    if isinstance(lm, JaxLanguageModel):
        return JaxLanguageModel(lm.decoder, lm.tokenizer, eos_token_ids=sorted(lm._eos_ids), **kwargs)
    return HFLanguageModel(lm.model, lm.tokenizer, **kwargs)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture()
def fresh_any(backend: str, lm32: HFLanguageModel, request: pytest.FixtureRequest):
    """A factory of views of the default backbone in the backend under test (``torch`` or ``jax``)."""
    base = lm32 if backend == "torch" else request.getfixturevalue("jax32")
    return lambda **kwargs: view(base, **kwargs)


def passes(lm: Any) -> list[int]:
    """The token counts of ``lm``'s forward passes from now on (a list that grows): every pass of
    the PyTorch backend (``_forward``), every stream pass of the JAX backend (``_run``)."""
    counted: list[int] = []
    if isinstance(lm, HFLanguageModel):
        inner = lm._forward
        lm._forward = lambda input_ids, cache, **kw: counted.append(input_ids.shape[1]) or inner(input_ids, cache, **kw)
    else:
        inner = lm._run
        lm._run = lambda cache, p, *args, **kw: counted.append(len(p.tokens)) or inner(cache, p, *args, **kw)
    return counted


def tiny_folder(folder: Path, kind: str, **sizes: int) -> Path:
    """A randomly initialised two-layer model of ``kind`` (``llama``: Llama 3 RoPE scaling, untied
    head; ``qwen2``: tied embeddings and nonzero q/k/v biases; ``qwen3``: per-head q/k norms and a
    head size apart from hidden / heads) with the default model's tokenizer, saved as a HuggingFace
    folder; ``sizes`` replace config fields (``num_attention_heads=16``, ...)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from agent_shell.lm.default_model import default_model_dir

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    shape = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, initializer_range=0.1,
                 bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id) | sizes
    torch.manual_seed(0)
    if kind == "llama":
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256, "rope_theta": 50000.0}
        model = LlamaForCausalLM(LlamaConfig(**shape, rope_parameters=rope, tie_word_embeddings=False))
    elif kind == "qwen3":  # per-head q/k norms (random weights, so a skipped norm shows), head_dim apart
        from transformers import Qwen3Config, Qwen3ForCausalLM

        model = Qwen3ForCausalLM(Qwen3Config(**(dict(head_dim=24) | shape), tie_word_embeddings=True))
        with torch.no_grad():
            for layer in model.model.layers:
                for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                    norm.weight.uniform_(0.5, 1.5)
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**shape, tie_word_embeddings=True))
        with torch.no_grad():  # initialised at zero: random, so that a dropped bias shows
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_backbones(tmp_path_factory) -> dict[str, tuple[HFLanguageModel, Any]]:
    """kind -> (the PyTorch backend, the JAX backend) of :func:`tiny_folder`'s model, float32 on
    the CPU, both loaded from the same folder."""
    out = {}
    for kind in ("llama", "qwen2"):
        folder = tiny_folder(tmp_path_factory.mktemp(f"tiny-{kind}"), kind)
        out[kind] = (load_language_model(str(folder), dtype="float32", device="cpu"),
                     load_language_model(f"jax:{folder}", dtype="float32", device="cpu"))
    return out


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
