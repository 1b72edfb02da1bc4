"""The LM-backend plug-in seam: a package registered under ``cb_agent.lm_backends`` is selected
by name (``--model NAME:ARG``) with no change to cb-agent; model URIs pick built-in backends."""

from __future__ import annotations

from pathlib import Path

import numpy as np
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
    install_plugin(site, "constant", "math:pi")
    with pytest.raises(ValueError, match="'constant': its entry point gives a float, not a factory"):
        load_language_model("constant:")
    install_plugin(site, "notlm", "builtins:dict")
    with pytest.raises(ValueError, match="'notlm': its factory returned a dict"):
        load_language_model("notlm:")


STRUCTURAL = '''
import numpy as np
from agent_shell.lm.protocol import CandidateScores

class Scores:
    name, hidden_size = "structural", 2
    def score(self, context, candidates, action_prefix):
        return CandidateScores(np.array([-1.0, -3.0][:len(candidates)], np.float32),
                               np.ones(len(candidates), np.int32),
                               np.array([[1.0, 0.0], [0.0, 1.0]][:len(candidates)], np.float32))
    def generate(self, prompt, max_new_tokens=64, stop=(), temperature=0.0, n=1, seed=None):
        return [""] * n
    def fork(self):
        return self

def load(arg, *, dtype="auto", device=None):
    return Scores()
'''


def test_a_plugin_with_no_base_class_is_a_backend_and_gets_the_host_decision(site):
    """A backend object with name / hidden_size / score / generate / fork and no base class (the
    protocol implemented structurally) loads, and the decision function decides on its scores:
    log P = log softmax(prior + alpha . phi) over the set, computed here by hand."""
    import cb_core
    from agent_shell.lm.decision import decide

    (site / "structural_backend.py").write_text(STRUCTURAL)
    install_plugin(site, "structural", "structural_backend:load")
    lm = load_language_model("structural:")
    assert type(lm).__mro__[1:] == (object,) and not hasattr(lm, "decide")
    alpha = np.array([0.5, -2.0, 0.25], np.float32)  # (weights of the two features, bias)
    decided = decide(lm, "ctx", ["a", "b"], "\n> ", cb_core.Concept(alpha, 0.8, 1e-6).decision_head)
    # one token each: prior = log softmax(log q); the features standardised over the set (population
    # std): (+1, -1) and (-1, +1); the bias coordinate is M ** -0.5
    prior = np.array([-1.0, -3.0]) - np.logaddexp(-1.0, -3.0)
    term = np.array([0.5 - (-2.0), -0.5 + (-2.0)]) + 0.25 / np.sqrt(2)
    log_p = prior + term - np.logaddexp(*(prior + term))
    np.testing.assert_allclose(decided.prior, prior, atol=1e-5)
    np.testing.assert_allclose(decided.concept_term, term, atol=1e-5)
    np.testing.assert_allclose(decided.log_p, log_p, atol=1e-5)
    assert decided.chosen == 0


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
