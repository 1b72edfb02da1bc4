"""benchmarks/mesh_plan.py against independent counts: the parameters of tiny random transformers
models, the bytes of the KV cache transformers fills, the Qwen3 model cards' parameter figures, and
the docs table the script prints."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from agent_shell.lm.buckets import MIN_CAPACITY

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("benchmark_mesh_plan", ROOT / "benchmarks" / "mesh_plan.py")
mesh_plan = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
spec.loader.exec_module(mesh_plan)

#: Tiny shapes whose head counts (4 query, 2 key/value), hidden (48) and vocabulary (64) sizes divide
#: meshes of 1 and 2; head_dim 16 is hidden / heads for Llama and Qwen2, given apart for Qwen3.
TINY = {"hidden_size": 64, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 64, "max_position_embeddings": 2048}
TINY_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def write_config(folder: Path, kind: str, tie: bool) -> Path:
    raw = {**TINY, "model_type": kind, "tie_word_embeddings": tie, **({"head_dim": 16} if kind == "qwen3" else {})}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    return folder / "config.json"


def tiny_model(path: Path, kind: str):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(**json.loads(path.read_text()))
    return getattr(transformers, TINY_CLASSES[kind])(config).to(torch.bfloat16).eval()


@pytest.mark.parametrize("kind", sorted(TINY_CLASSES))
@pytest.mark.parametrize("tie", [True, False])
def test_counts_match_a_tiny_transformers_model(tmp_path, kind, tie):
    """The whole model's parameters are ``sum(p.numel())`` of the transformers model (a tied head
    once); on a mesh of 2 each device holds the norms whole and half of every other tensor; the KV
    cache is the bytes transformers' own cache holds after a forward, halved on 2 devices."""
    import torch

    path = write_config(tmp_path / kind, kind, tie)
    model = tiny_model(path, kind)
    params = dict(model.named_parameters())
    total = sum(p.numel() for p in params.values())
    norms = sum(p.numel() for name, p in params.items() if "norm" in name)
    name, c = mesh_plan.read_decoder(str(path))
    batch, context = 1, MIN_CAPACITY  # the JAX buffer's least capacity, so slots == context
    plans = {n: mesh_plan.plan(c, name, n, context, batch, "bfloat16", 10**9) for n in (1, 2)}
    assert plans[1].parameters == plans[2].parameters == total
    assert plans[1].parameters_per_device == total
    assert plans[2].parameters_per_device == norms + (total - norms) // 2
    assert plans[2].weight_bytes == 2 * (norms + (total - norms) // 2)
    with torch.no_grad():
        ids = torch.randint(0, TINY["vocab_size"], (batch, context))
        cache = model(input_ids=ids, use_cache=True).past_key_values
    cached = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert cached == 2 * TINY["num_hidden_layers"] * batch * context * TINY["num_key_value_heads"] * 16 * 2
    assert plans[1].kv_bytes == cached and plans[2].kv_bytes == cached // 2


#: The Qwen3 model cards' figures: (total, non-embedding) parameters in billions, as printed.
MODEL_CARDS = {"qwen3-4b": ("4.0", "3.6"), "qwen3-8b": ("8.2", "6.95"), "qwen3-14b": ("14.8", "13.2"),
               "qwen3-32b": ("32.8", "31.2")}


@pytest.mark.parametrize("model", sorted(MODEL_CARDS))
def test_qwen3_counts_round_to_the_model_cards(model):
    """Total and non-embedding parameters (less the embeddings and an untied head) round to the cards'."""
    name, c = mesh_plan.read_decoder(model)
    p = mesh_plan.plan(c, name, 1, 1024, 1, "bfloat16", 10**12)
    embedding = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    total, non_embedding = MODEL_CARDS[model]
    digits = len(total.split(".")[1])
    assert f"{p.parameters / 1e9:.{digits}f}" == total
    digits = len(non_embedding.split(".")[1])
    assert f"{(p.parameters - embedding) / 1e9:.{digits}f}" == non_embedding


def test_refusals_name_the_counts_and_the_bytes():
    """A 16-device mesh cuts Qwen3's 8 key/value heads (and the 14B's 40 query heads); 32B with a
    batch of 8 x 8,192 tokens on one H100 is over the budget: weights + KV > 72 GB."""
    _, c14 = mesh_plan.read_decoder("qwen3-14b")
    p = mesh_plan.plan(c14, "14b", 16, 8192, 1, "bfloat16", 16 * 10**9)
    assert p.refused == ("num_attention_heads 40 is not a multiple of the mesh's 16 devices",
                         "num_key_value_heads 8 is not a multiple of the mesh's 16 devices")
    assert p.weight_bytes is None and not p.fits
    _, c32 = mesh_plan.read_decoder("qwen3-32b")
    p = mesh_plan.plan(c32, "32b", 1, 8192, 8, "bfloat16", 80 * 10**9)
    kv = 2 * 64 * 8 * 8192 * 8 * 128 * 2
    assert p.kv_bytes == kv and p.weight_bytes == 2 * p.parameters and p.budget == 72 * 10**9
    assert p.weight_bytes + kv > 72 * 10**9 and not p.fits
    assert re.fullmatch(r"weights 65\.52 GB \+ KV cache 17\.18 GB = 82\.7 GB per device exceed the budget 72 GB "
                        r"\(80 GB less 10% headroom\)", p.refused[0])
    assert p.largest_context == 0  # 2,048 slots x 8 would fit, but the least buffer is 4,096 slots: none does
    assert p.weight_bytes + kv // 4 <= p.budget < p.weight_bytes + kv // 2


def test_main_prints_the_docs_table_and_refuses_bad_input(tmp_path, capsys):
    """``--table`` prints docs/mesh-plan.md's table line for line and writes the plans; a plan that does
    not fit exits 1; a config that is no JSON object exits 2 in one line."""
    out = tmp_path / "plans.json"
    assert mesh_plan.main(["--table", "--context", "8192", "--batch", "8", "--out", str(out)]) == 1
    printed = capsys.readouterr().out.strip().splitlines()
    docs = (ROOT / "docs" / "mesh-plan.md").read_text().splitlines()
    start = docs.index(printed[0])
    assert docs[start:start + len(printed)] == printed
    plans = json.loads(out.read_text())
    assert len(plans) == len(mesh_plan.MODELS) * len(mesh_plan.DEVICES)
    assert {p["model"] for p in plans if not p["fits"]} == {"qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b"}
    path = write_config(tmp_path / "m", "qwen3", tie=True)
    assert mesh_plan.main(["--config", str(path), "--mesh", "2", "--device-memory", "1GiB",
                           "--context", "100", "--batch", "1"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("fits")
    path.write_text("[1]")
    assert mesh_plan.main(["--config", str(path), "--mesh", "2", "--device-memory", "1GB"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "holds a JSON list, not an object" in err
