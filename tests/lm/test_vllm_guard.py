"""Without vLLM, selecting the vllm backend fails with one line that says how to install it."""

import sys

import pytest

from agent_shell.lm import load_language_model


def test_vllm_uri_without_vllm_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if vLLM were not installed (it is not, on CPU machines)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'cb-agent\[vllm\]'.*unverified"):
        load_language_model("vllm:default")
