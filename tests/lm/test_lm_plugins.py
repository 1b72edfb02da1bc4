"""The LM-backend plug-in seam: a package registered under ``cb_agent.lm_backends`` is selected
by name (``--model NAME:ARG``) with no change to cb-agent; model URIs pick built-in backends."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from agent_shell.cli import main
from entry_point_doubles import install_entry_point
from agent_shell.lm import LanguageModel, load_language_model
from agent_shell.lm.factory import ENTRY_POINT_GROUP, split_model_uri


def install_plugin(site: Path, name: str = "tiny", target: str = "tiny_lm_backend:load") -> None:
    """What ``pip install`` of a package declaring the LM-backend entry point leaves on the path."""
    install_entry_point(site, ENTRY_POINT_GROUP, name, target, f"tiny-lm-backend-{name}")


def test_a_registered_backend_is_selected_by_name(site):
    install_plugin(site)
    lm = load_language_model("tiny:4", reply=" go to desk 1")
    assert isinstance(lm, LanguageModel) and lm.name == "tiny:4"
    scores = lm.score("ctx", ["abc", "look around"], "\n> ")
    assert scores.log_q.tolist() == [-0.75, -2.75] and scores.hidden.shape == (2, 8)
    assert lm.generate("prompt", n=2) == [" go to desk 1"] * 2
    out = CliRunner().invoke(main, ["backends"])
    assert out.exit_code == 0 and "tiny\ttiny_lm_backend:load" in out.output and "vllm\tbuilt-in" in out.output


def test_unknown_broken_and_non_lm_backends_fail_with_one_clear_line(site):
    with pytest.raises(ValueError, match=r"unknown LM backend 'nope'.*'hf'.*'vllm'.*cb_agent.lm_backends"):
        load_language_model("nope:x")
    install_plugin(site, "broken", "no_such_module_xyz:load")
    with pytest.raises(ValueError, match=r"LM backend 'broken' \(no_such_module_xyz:load\) failed to load: "
                                         r"ModuleNotFoundError"):
        load_language_model("broken:")
    install_plugin(site, "notlm", "builtins:dict")
    with pytest.raises(ValueError, match="'notlm': its factory returned a dict"):
        load_language_model("notlm:")


def test_a_plugin_cannot_take_a_builtin_name(site):
    install_plugin(site, "vllm", "tiny_lm_backend:load")
    from agent_shell.lm.factory import available_backends

    assert available_backends()["vllm"] == "built-in"


def test_model_uris(tmp_path):
    assert split_model_uri(None) == ("hf", None)
    assert split_model_uri("vllm:/models/qwen") == ("vllm", "/models/qwen")
    assert split_model_uri("HuggingFaceTB/SmolLM2-135M") == ("hf", "HuggingFaceTB/SmolLM2-135M")
    odd = tmp_path / "a:b"
    odd.mkdir()
    assert split_model_uri(str(odd)) == ("hf", str(odd))  # an existing folder wins over a scheme
