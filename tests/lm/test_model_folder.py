"""One loading rule of a model folder for both backends (:mod:`agent_shell.lm.model_folder`,
:mod:`agent_shell.lm.model_config`): a folder whose config and weights disagree, or that holds a
broken file, is refused in one line before anything loads, on either backend; the JAX decoder reads
a folder exactly as transformers does (head, RoPE, window, generation config); weights that are not
finite and passes that cannot run stop the run in one line; JAX's platform setting is one line.

Every folder is built here from :func:`conftest.tiny_folder`'s tiny random models (no download)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import agent_shell
from agent_shell.cli import main
from conftest import tiny_folder
from test_gpu_route import _no_loading
from test_lm_scoring import ALFWORLD_CANDIDATES, PREFIX, make_context

CODE = Path(agent_shell.__file__).resolve().parents[1]  # the checkout under test (subprocesses import it)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """kind -> a tiny random model folder (``qwen2``: tied head; ``llama``: Llama 3 RoPE, untied)."""
    return {kind: tiny_folder(tmp_path_factory.mktemp(f"tiny-{kind}"), kind) for kind in ("qwen2", "llama")}


def uri(backend: str, folder: Path) -> str:
    return f"jax:{folder}" if backend == "jax" else str(folder)


def edit_config(folder: Path, **change) -> None:
    """Set (or, with None, remove) fields of ``folder``'s config.json."""
    config = json.loads((folder / "config.json").read_text())
    for key, value in change.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def edit_weights(folder: Path, change) -> None:
    """Rewrite ``folder``'s model.safetensors with ``change(tensors)``'s tensors."""
    from safetensors.torch import load_file, save_file

    tensors = change(load_file(str(folder / "model.safetensors")))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def copy_of(folder: Path, to: Path) -> Path:
    return Path(shutil.copytree(folder, to))


# ---------------------------------------------------------------------------------------- the faults
def small_vocab(folder: Path) -> None:  # the embedding table and config agree; the tokenizer has 49,152 ids
    edit_weights(folder, lambda w: {k: v[:1000].clone() if k == "model.embed_tokens.weight" else v
                                    for k, v in w.items()})
    edit_config(folder, vocab_size=1000)


def untied_without_head(folder: Path) -> None:
    edit_config(folder, tie_word_embeddings=False)


def more_heads(folder: Path) -> None:  # 8 heads over 4 heads' weights
    edit_config(folder, num_attention_heads=8)


def huge_window(folder: Path) -> None:
    edit_config(folder, max_position_embeddings=2**40)


def truncated_weights(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:len(data) // 2])


def lfs_pointer(folder: Path) -> None:
    (folder / "model.safetensors").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 12582912\n")


def truncated_config(folder: Path) -> None:
    text = (folder / "config.json").read_text()
    (folder / "config.json").write_text(text[:len(text) // 2])


def llava_folder(folder: Path) -> None:  # a multimodal folder: the language model under text_config
    text_config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llava", "architectures": ["LlavaForConditionalGeneration"], "text_config": text_config,
        "vision_config": {"model_type": "clip_vision_model"}, "image_token_index": 32000}))
    edit_weights(folder, lambda w: {f"language_model.{k}": v for k, v in w.items()})


FAULTS = {  # fault -> (make it, what the one line names: the file, the field, both values)
    "ids past the embedding table": (small_vocab, ["config.json", "vocab_size is 1,000", "49,152 tokens"]),
    "an untied head with no lm_head.weight": (untied_without_head, ["config.json", "tie_word_embeddings is false",
                                                                     "no lm_head.weight"]),
    "head counts the weights do not have": (more_heads, [
        "model.safetensors", "model.layers.0.self_attn.k_proj.weight is [32, 64]", "implies [16, 64]",
        "num_attention_heads 8"]),
    "an absurd window": (huge_window, ["config.json", "max_position_embeddings is 1,099,511,627,776"]),
    "truncated weights": (truncated_weights, ["model.safetensors", "not a whole safetensors file"]),
    "a Git LFS pointer for the weights": (lfs_pointer, ["model.safetensors", "Git LFS pointer"]),
    "a truncated config.json": (truncated_config, ["config.json", "not valid JSON", "line "]),
    "a LLaVA-style multimodal folder": (llava_folder, ["config.json", "'llava'", "text_config", "'qwen2'"]),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_folder_that_disagrees_with_itself_is_one_line_before_anything_loads(tiny, tmp_path, monkeypatch,
                                                                                backend, fault):
    """The command's checks refuse the folder, in one line naming the file, the field and both
    values, before the set-up (the expert demonstrations) or the backbone loads; both backends
    alike, and a backend's own loader refuses it in the same line."""
    from agent_shell.lm.hf import HFLanguageModel
    from agent_shell.lm.jax_backend import JaxLanguageModel

    make, named = FAULTS[fault]
    folder = copy_of(tiny["qwen2"], tmp_path / "model")
    make(folder)
    _no_loading(monkeypatch)
    out = CliRunner().invoke(main, ["run", "--env", "textworld", "--model", uri(backend, folder)])
    assert out.exit_code == 1 and out.output.strip().count("\n") == 0, out.output
    line = out.output.strip()
    assert str(folder) in line and all(text in line for text in named), line
    loader = JaxLanguageModel if backend == "jax" else HFLanguageModel
    with pytest.raises((ValueError, FileNotFoundError)) as err:
        loader.from_pretrained(folder, dtype="float32", device="cpu")
    assert " ".join(str(err.value).split()) == line.removeprefix("Error: ")


# ---------------------------------------------------------------------------------------- PyTorch pickles, quantized weights
def as_pickles(folder: Path, to: Path, shards: int = 1) -> Path:
    """``folder``'s model as transformers saved it before safetensors was the default:
    ``pytorch_model.bin``, or ``shards`` files ``pytorch_model-0000i-of-0000n.bin`` and their
    ``pytorch_model.bin.index.json``."""
    from safetensors.torch import load_file

    to.mkdir()
    for f in folder.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, to / f.name)
    weights = load_file(str(folder / "model.safetensors"))
    if shards == 1:
        torch.save(weights, to / "pytorch_model.bin")
        return to
    names, weight_map = sorted(weights), {}
    for i in range(shards):
        file = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        torch.save({n: weights[n] for n in names[i::shards]}, to / file)
        weight_map |= {n: file for n in names[i::shards]}
    (to / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return to


@pytest.mark.parametrize("shards", [1, 3], ids=["one file", "sharded"])
def test_a_folder_of_pytorch_pickles_loads_and_scores_as_its_safetensors_twin(tiny, tmp_path, shards):
    """A Llama folder with ``pytorch_model.bin`` and no safetensors (one file, or shards and their
    index) passes the checks, its shapes read without loading a tensor, and the PyTorch backend
    scores what it scores from the safetensors folder."""
    from agent_shell.lm import load_language_model
    from agent_shell.lm.model_folder import check_model_folder, tensor_shapes

    folder = as_pickles(tiny["llama"], tmp_path / "bin", shards)
    check_model_folder(folder)
    shapes, want = tensor_shapes(folder), tensor_shapes(tiny["llama"])
    assert {k: v[0] for k, v in shapes.items()} == {k: v[0] for k, v in want.items()}
    context = make_context(1)
    got, ref = (load_language_model(str(f), dtype="float32", device="cpu").score(context, ALFWORLD_CANDIDATES[:3],
                                                                                   PREFIX)
                for f in (folder, tiny["llama"]))
    np.testing.assert_array_equal(got.log_q, ref.log_q)


def test_a_folder_of_pytorch_pickles_is_refused_by_the_jax_backend_naming_the_other(tiny, tmp_path):
    from agent_shell.lm.model_folder import check_model_folder

    folder = as_pickles(tiny["qwen2"], tmp_path / "bin")
    with pytest.raises(FileNotFoundError, match="no safetensors weights.*pytorch_model.bin.*PyTorch backend"):
        check_model_folder(folder, backend="jax")


def gptq_weights(folder: Path) -> None:
    """``folder`` as AutoGPTQ saves a 4-bit model: packed int32 ``qweight``/``qzeros``, ``scales`` and
    ``g_idx`` in place of each projection's ``weight``, and ``quantization_config`` in config.json."""
    def quantize(w):
        out = {}
        for name, v in w.items():
            if "layers" not in name or not name.endswith("proj.weight"):
                out[name] = v
                continue
            base = name.removesuffix(".weight")
            out |= {f"{base}.qweight": torch.zeros(v.shape[1] // 8, v.shape[0], dtype=torch.int32),
                    f"{base}.qzeros": torch.zeros(1, v.shape[0] // 8, dtype=torch.int32),
                    f"{base}.scales": torch.ones(1, v.shape[0], dtype=torch.float16),
                    f"{base}.g_idx": torch.zeros(v.shape[1], dtype=torch.int32)}
        return out

    edit_weights(folder, quantize)
    edit_config(folder, quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False})


def test_a_pre_quantized_folder_is_refused_naming_its_quantization(tiny, tmp_path, monkeypatch, backend):
    """A GPTQ folder is refused in one line naming config.json's quantization_config and the
    method, not a missing q_proj.weight; on either backend, before anything loads."""
    folder = copy_of(tiny["qwen2"], tmp_path / "model")
    gptq_weights(folder)
    _no_loading(monkeypatch)
    out = CliRunner().invoke(main, ["run", "--env", "textworld", "--model", uri(backend, folder)])
    line = out.output.strip()
    assert out.exit_code == 1 and "\n" not in line, out.output
    assert str(folder / "config.json") in line and "quantization_config" in line and "gptq 4-bit" in line, line
    assert "q_proj" not in line


# ---------------------------------------------------------------------------------------- read as transformers reads
def stored_head_under_tie(folder: Path) -> None:  # transformers keeps both (and warns)
    def add_head(w):
        generator = torch.Generator().manual_seed(1)
        w["lm_head.weight"] = torch.randn(w["model.embed_tokens.weight"].shape, generator=generator) * 0.1
        return w

    edit_weights(folder, add_head)


def rope_scaling_beside_rope_parameters(folder: Path) -> None:  # transformers 5: rope_scaling replaces them
    edit_config(folder, rope_scaling={"rope_type": "linear", "factor": 4.0})


def no_window(folder: Path) -> None:  # transformers takes the architecture's default
    edit_config(folder, max_position_embeddings=None)


READ_ALIKE = {"a stored head under tie_word_embeddings": ("qwen2", stored_head_under_tie),
              "rope_scaling beside rope_parameters": ("llama", rope_scaling_beside_rope_parameters),
              "no max_position_embeddings": ("qwen2", no_window)}


@pytest.mark.parametrize("case", READ_ALIKE)
def test_the_jax_decoder_reads_a_folder_as_transformers_does(tiny, tmp_path, case):
    """Where transformers resolves a folder's settings (the head it keeps, the RoPE parameters it
    applies, the window it defaults to), the JAX backend scores what the PyTorch backend scores,
    to float32 rounding, and takes the same window."""
    from transformers import AutoConfig

    from agent_shell.lm import load_language_model

    kind, make = READ_ALIKE[case]
    folder = copy_of(tiny[kind], tmp_path / "model")
    make(folder)
    torch_lm = load_language_model(str(folder), dtype="float32", device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jax_lm = load_language_model(f"jax:{folder}", dtype="float32", device="cpu")
    said = [str(w.message) for w in caught if "the stored head is used" in str(w.message)]
    assert len(said) == (make is stored_head_under_tie), said  # one line says the head is not tied
    window = AutoConfig.from_pretrained(folder).max_position_embeddings
    assert jax_lm.max_context_tokens == torch_lm.max_context_tokens == window
    context = make_context(2)
    want, got = (lm.score(context, ALFWORLD_CANDIDATES[:3], PREFIX) for lm in (torch_lm, jax_lm))
    np.testing.assert_allclose(got.log_q, want.log_q, atol=1e-4, rtol=0)
    assert np.abs(got.hidden - want.hidden).max() / np.abs(want.hidden).max() < 1e-4


@pytest.mark.parametrize("content", ['{\n  "do_sample": true.\n  "bos_token_id": 1\n}\n', ""],
                         ids=["a typo", "empty"])
def test_a_generation_config_transformers_cannot_read_is_ignored_by_both_backends(tiny, tmp_path, content):
    """Llama-2-13b-hf's published typo, or an empty file: transformers ignores it and takes
    config.json's end-of-sequence id; the JAX backend plays the folder with the same ids, and a
    warning line names the file."""
    from agent_shell.lm import load_language_model

    folder = copy_of(tiny["qwen2"], tmp_path / "model")
    (folder / "generation_config.json").write_text(content)
    loaded = {}
    for backend in ("jax", "torch"):
        with pytest.warns(UserWarning, match=rf"{folder / 'generation_config.json'} .*ignored"):
            loaded[backend] = load_language_model(uri(backend, folder), dtype="float32", device="cpu")
    jax_lm, torch_lm = loaded["jax"], loaded["torch"]
    assert torch_lm.model.generation_config.eos_token_id == json.loads((folder / "config.json").read_text())[
        "eos_token_id"]
    assert jax_lm._eos_ids == torch_lm._eos_ids


# ---------------------------------------------------------------------------------------- faults that stop a run
def test_weights_that_are_not_finite_are_one_line_at_load(tiny, tmp_path, backend):
    from agent_shell.lm import load_language_model

    folder = copy_of(tiny["qwen2"], tmp_path / "model")

    def nan(w):
        w["model.layers.1.mlp.down_proj.weight"][3, 5] = float("nan")
        w["model.layers.1.mlp.down_proj.weight"][0, 0] = float("inf")
        return w

    edit_weights(folder, nan)
    with pytest.raises(ValueError) as err:
        load_language_model(uri(backend, folder), dtype="float32", device="cpu")
    line = str(err.value)
    assert "\n" not in line and str(folder / "model.safetensors") in line
    assert "model.layers.1.mlp.down_proj.weight holds 2 non-finite" in line


def test_a_pass_that_cannot_run_is_a_fault_of_the_backbone(tiny, backend, monkeypatch, no_executable_store):
    """Head counts that do not fit the weights reach a pass only when the checks are bypassed
    (here: the loaded model changed in place); the pass's error (a reshape) is then a
    BackboneFault, which the scheduler does not retry. The broken decoder is traced afresh (no
    program of the intact one from this process's executable store)."""
    from agent_shell.lm import load_language_model
    from agent_shell.lm.jax_backend import JaxLanguageModel
    from agent_shell.lm.jax_model import Decoder, read_weights
    from agent_shell.lm.protocol import BackboneFault

    lm = load_language_model(uri(backend, tiny["qwen2"]), dtype="float32", device="cpu")
    if backend == "jax":
        decoder = Decoder(lm.config, read_weights(tiny["qwen2"]))
        decoder.blocks.heads = 8  # 8 heads over 4 heads' weights
        lm = JaxLanguageModel(decoder, lm.tokenizer, name="broken")
    else:
        for layer in lm.model.model.layers:
            layer.self_attn.head_dim = 7  # 64 query features are no whole number of 7-wide heads
    with pytest.raises(BackboneFault) as err:
        lm.score(make_context(1), ALFWORLD_CANDIDATES[:2], PREFIX)
    assert "\n" not in str(err.value) and ("reshape" in str(err.value) or "invalid" in str(err.value))


def _oom(kind: str) -> tuple[BaseException, int]:
    """A library's own out-of-memory error, as it words it, and the bytes it asks for."""
    import jax

    if kind == "torch-cpu":  # PyTorch's CPU allocator: a plain RuntimeError
        return RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                            "memory: you tried to allocate 3221225472 bytes. Error code 12 (Cannot allocate "
                            "memory)"), 3 * 2**30
    if kind == "torch-cuda":
        return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total "
                                      "capacity of 79.15 GiB of which 100.00 MiB is free."), 512 * 2**20
    return jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 805306368 "
                                      "bytes."), 805306368


@pytest.mark.parametrize("kind", ["torch-cpu", "torch-cuda", "jax"])
def test_a_pass_out_of_memory_is_a_fault_of_the_episode_naming_its_context(tiny, monkeypatch, kind):
    """A pass that runs out of memory (each library's own error, raised where the backend's pass
    runs) is no fault of the backbone: :class:`PassOutOfMemory`, one line naming the pass, the
    context's length in tokens and the bytes asked (an engine fault: the episode's error record)."""
    import cb_core.cache
    from agent_shell.lm import load_language_model
    from agent_shell.lm.faults import PassOutOfMemory
    from cb_io.records import EngineError

    lm = load_language_model(uri("jax" if kind == "jax" else "torch", tiny["qwen2"]), dtype="float32", device="cpu")
    error, asked = _oom(kind)

    def out_of_memory(*args, **kwargs):
        raise error

    if kind == "jax":
        monkeypatch.setattr(cb_core.cache, "call_compiled", out_of_memory)
    else:
        monkeypatch.setattr(lm.model, "forward", out_of_memory)
    context = make_context(2)
    with pytest.raises(PassOutOfMemory) as err:
        lm.score(context, ALFWORLD_CANDIDATES[:2], PREFIX)
    held = len(lm.tokenizer(context)["input_ids"])  # the context the first pass encodes
    assert isinstance(err.value, EngineError) and "\n" not in str(err.value)
    assert err.value.details["bytes_asked"] == asked
    tokens = err.value.details["context_tokens"]
    # the failing pass's own context: the whole context where one pass encodes it (PyTorch), the first
    # pass the JAX backend runs for it (a pinned head or a prefill chunk) where the context is encoded in parts
    assert (0 < tokens <= held + 64) if kind == "jax" else (held <= tokens <= held + 64), (tokens, held)
    assert f"on a context of {tokens:,} tokens" in str(err.value) and f"{asked:,} bytes" in str(err.value)


@pytest.mark.parametrize("setting", ["tpu", "bogus", "cuda", "cpu,tpu"])
def test_a_jax_platform_setting_jax_cannot_start_is_one_line(tmp_path, setting):
    """``JAX_PLATFORMS`` naming a platform this machine lacks (an unknown one, cuda without a GPU,
    one of two) is one line naming the setting and the platform, not a traceback, a bare
    AssertionError or a device 'not seen' among those seen."""
    if setting == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    env = dict(os.environ, JAX_PLATFORMS=setting, PYTHONPATH=os.pathsep.join([str(CODE), os.environ.get(
        "PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-m", "agent_shell.cli", "run", "--model", "jax:", "--device", "cpu"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    errors = [line for line in (res.stdout + res.stderr).splitlines() if line.startswith("Error")]
    assert res.returncode == 1 and "Traceback" not in res.stderr and len(errors) == 1, res.stderr[-3000:]
    assert "Usage:" not in res.stdout + res.stderr  # the machine's setting, not a mistyped option
    assert f"JAX_PLATFORMS={setting!r}" in errors[0], errors
    if setting != "cuda":
        assert f"'{setting.split(',')[-1]}'" in errors[0] and "sees no" not in errors[0], errors
