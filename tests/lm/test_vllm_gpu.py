"""The vLLM backend against the HF backend on a GPU (marker ``gpu``: deselected by default, run
with ``python -m pytest -m gpu`` on a machine with CUDA and ``pip install 'cb-agent[vllm]'``).
Without a GPU this test fails rather than skips: select it only where it can run."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.gpu
def test_vllm_backend_agrees_with_the_hf_backend_in_float32():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "vllm_agreement.py"), "--dtype", "float32"],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
