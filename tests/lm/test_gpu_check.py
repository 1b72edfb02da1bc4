"""``benchmarks/gpu_check.py --quick`` runs end to end on the CPU (the full check needs a GPU)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.mark.slow
def test_gpu_check_quick_runs_on_the_cpu_and_every_section_passes(tmp_path):
    spec = importlib.util.spec_from_file_location("benchmark_gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "gpu_check.json"
    report = module.main(["--quick", "--device", "cpu", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["verdicts"] == report["verdicts"]
    assert sorted(written["verdicts"]) == ["batched", "cache_reuse", "exactness_bfloat16", "exactness_float32", "fit",
                                           "jax_exactness_bfloat16", "jax_exactness_float32", "persistent_cache",
                                           "step_cost_warm_below_naive"]
    assert all(written["verdicts"].values()), written["verdicts"]
    env = written["environment"]
    assert env["device"] == "cpu" and env["cb_core_matmul_precision"] == "highest"
    for context, row in written["exactness"]["float32"].items():  # each layout against the naive forward
        assert sorted(row) == ["batched", "packed", "tree"], context
        assert all(gap["log_q"] <= 1e-4 and gap["hidden_rel"] <= 1e-4 for gap in row.values()), (context, row)
    growing = written["exactness"]["growing_context"]
    assert growing["context_tokens_encoded"] < growing["context_tokens_total"]
    cost = written["step_cost"]
    assert len(cost["cold_s"]) == len(cost["naive_padded_s"]) == 3 and cost["candidates"] == 8
    jax = written["jax"]  # the JAX backend against the PyTorch naive forward, then beside the PyTorch backend
    for context, row in jax["float32"].items():
        assert sorted(row) == ["batched", "packed", "tree"], context
        assert all(gap["log_q"] <= 1e-4 and gap["hidden_rel"] <= 1e-4 for gap in row.values()), (context, row)
    step = jax["step"]
    assert len(step["jax_warm_s"]) == len(step["torch_warm_s"]) == 2 and step["jax_over_torch_warm"] > 0
