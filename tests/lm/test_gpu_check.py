"""``benchmarks/gpu_check.py --quick`` runs end to end on the CPU (the full check needs a GPU), and the
step measurements of ``benchmarks/_gpu_steps.py`` classify, merge and judge as stated."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import statistics
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPT = BENCHMARKS / "gpu_check.py"
NOT_MEASURED = "not measured on CPU"
TARGET_NAMES = sorted(f"{b}_{k}" for b in ("torch", "jax") for k in ("warm_median_s", "max_over_median", "busy_share"))


def load(path: Path, name: str, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the helpers import each other by name
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ScriptedLM:
    """A backend whose ``score`` meets a new program on the listed calls (counted from 0)."""

    def __init__(self, new_program_on: set[int]):
        self.new_program_on, self.calls, self.program_count, self.contexts = new_program_on, 0, 0, []

    def score(self, context, candidates, prefix):
        self.program_count += self.calls in self.new_program_on
        self.calls += 1
        self.contexts.append(context)


def test_warm_steps_list_every_step_that_met_a_program_apart_and_stop_at_the_warm_count(monkeypatch):
    steps = load(BENCHMARKS / "_gpu_steps.py", "benchmark_gpu_steps", monkeypatch)
    cpu = SimpleNamespace(type="cpu")
    # call 0 is the first call, calls 1-2 the warm-up, then steps 3, 4, ... (call k is step k)
    lms = {"a": ScriptedLM({0, 2, 4, 7}), "b": ScriptedLM(set())}
    rows = steps.warm_steps({n: steps.Episode(lm, "ctx", ["x"], cpu) for n, lm in lms.items()}, warmup=2, n_warm=3)
    assert [len(rows[n]["warmup_s"]) for n in "ab"] == [2, 2]
    assert rows["a"]["compiled_at_step"] == [4] and len(rows["a"]["compiled_s"]) == 1  # 2: warm-up, 7: not run
    assert lms["a"].calls == 1 + 2 + 4 and lms["b"].calls == 1 + 2 + 3  # each stops at 3 warm steps
    assert rows["a"]["warm_steps"] == rows["b"]["warm_steps"] == 3 and not rows["b"]["compiled_s"]
    assert lms["a"].contexts[1] == steps.grown("ctx", 0) and lms["a"].contexts[-1].count("open drawer") == 6
    # a backend that compiles at every step: at most 2 x n_warm steps after the warm-up, none warm
    always = ScriptedLM(set(range(100)))
    row = steps.warm_steps({"c": steps.Episode(always, "ctx", ["x"], cpu)}, warmup=1, n_warm=3)["c"]
    assert always.calls == 1 + 1 + 6 and row["compiled_at_step"] == [2, 3, 4, 5, 6, 7]
    assert row["warm_steps"] == 0 and row["median_s"] is None and row["max_over_median"] is None


def test_the_busy_time_is_the_union_of_the_device_intervals(monkeypatch):
    steps = load(BENCHMARKS / "_gpu_steps.py", "benchmark_gpu_steps", monkeypatch)
    rng = np.random.default_rng(0)
    for _ in range(50):
        starts = rng.integers(0, 100, size=rng.integers(1, 12))
        intervals = [(float(s), float(s + rng.integers(0, 30))) for s in starts]
        covered = np.zeros(200, bool)  # unit cells [t, t + 1) that some interval covers
        for start, end in intervals:
            covered[int(start):int(end)] = True
        assert steps.union_seconds(intervals) == covered.sum()
    assert steps.union_seconds([]) == 0


def test_the_busy_share_is_the_device_time_per_step_over_the_warm_median(monkeypatch):
    """The profilers replaced: a GPU trace's intervals, then a profiler that fails to start."""
    steps = load(BENCHMARKS / "_gpu_steps.py", "benchmark_gpu_steps", monkeypatch)
    episode = SimpleNamespace(device=SimpleNamespace(type="cuda"), step=lambda: (0.05, False))

    def traced(run, device):
        run()
        return [(1.0, 1.004), (1.002, 1.006), (1.05, 1.053)]  # 6 ms then 3 ms busy

    monkeypatch.setattr(steps, "jax_device_intervals", traced)
    out = steps.busy_share("jax", episode, 2, warm_median=0.04)
    assert out["profiled_wall_s"] == [0.05, 0.05] and out["device_events"] == 3
    assert out["kernel_s"] == pytest.approx(0.009, abs=1e-12)
    assert out["busy_share"] == pytest.approx(0.009 / 2 / 0.04) and out["busy_share_profiled"] == pytest.approx(0.09)

    def failing(run, device):
        raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")

    monkeypatch.setattr(steps, "torch_device_intervals", failing)
    out = steps.busy_share("torch", episode, 2, warm_median=0.04)
    assert out["busy_share"] is None and out["reason"] == ("the profiler failed: RuntimeError: "
                                                           "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")


def test_targets_compare_unrounded_values_and_say_why_they_were_not_measured(monkeypatch):
    steps = load(BENCHMARKS / "_gpu_steps.py", "benchmark_gpu_steps", monkeypatch)
    rows = {"torch": {"median_s": 0.025, "max_over_median": 2.0000001}, "jax": {"median_s": 0.0251,
                                                                           "max_over_median": 1.5}}
    busy = {"torch": {"busy_share": 0.5}, "jax": {"busy_share": None}}
    measured = steps.targets(rows, busy, None)
    met = {k: v["met"] for k, v in measured.items()}
    assert met == {"torch_warm_median_s": True, "torch_max_over_median": False, "torch_busy_share": True,
                   "jax_warm_median_s": False, "jax_max_over_median": True, "jax_busy_share": False}
    absent = steps.targets(rows, busy, NOT_MEASURED)
    assert sorted(absent) == TARGET_NAMES and {v["met"] for v in absent.values()} == {NOT_MEASURED}
    assert absent["torch_max_over_median"]["value"] == 2.0000001 and absent["jax_busy_share"]["value"] is None
    line = steps.target_line(absent["torch_warm_median_s"])
    assert line == f"torch_warm_median_s = 0.025 (target <= 0.025): {NOT_MEASURED}"
    assert steps.target_line(measured["torch_max_over_median"]) == ("torch_max_over_median = 2.0000001 "
                                                                     "(target <= 2.0): NOT MET")
    assert steps.target_line(measured["jax_busy_share"]) == "jax_busy_share = None (target >= 0.5): NOT MET"


@pytest.mark.slow
def test_gpu_check_quick_runs_on_the_cpu_and_every_section_passes(tmp_path, monkeypatch):
    module = load(SCRIPT, "benchmark_gpu_check", monkeypatch)
    out = tmp_path / "gpu_check.json"
    report = module.main(["--quick", "--device", "cpu", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["verdicts"] == report["verdicts"]
    assert sorted(written["verdicts"]) == ["batched", "cache_reuse", "exactness_bfloat16", "exactness_float32", "fit",
                                           "jax_exactness_bfloat16", "jax_exactness_float32", "many_concepts",
                                           "persistent_cache", "step_cost_warm_below_naive", "warm_steps_counted"]
    assert all(written["verdicts"].values()), written["verdicts"]
    assert written["mesh"] == {"ran": False, "why": "JAX sees 1 cpu device: a mesh needs two or more"}
    env = written["environment"]
    assert env["device"] == "cpu" and env["cb_core_matmul_precision"] == "highest"
    assert env["jax"] == importlib.metadata.version("jax") and env["flax"] == importlib.metadata.version("flax")
    assert env["allow_untested_needed"] == bool(env["outside_tested_ranges"]) and isinstance(env["allow_untested_set"],
                                                                                             bool)
    for context, row in written["exactness"]["float32"].items():  # each layout against the naive forward
        assert sorted(row) == ["batched", "packed", "tree"], context
        assert all(gap["log_q"] <= 1e-4 and gap["hidden_rel"] <= 1e-4 for gap in row.values()), (context, row)
    growing = written["exactness"]["growing_context"]
    assert growing["context_tokens_encoded"] < growing["context_tokens_total"]
    cache = written["fit"]["persistent_cache"]  # a cold process stored executables, the second loaded them all
    assert len(cache["pairs"]) == 1 and cache["pairs"][0]["cold_executables"] > 0
    assert cache["pairs"][0]["loaded_executables"] == cache["pairs"][0]["cold_executables"]
    many = written["many_concepts"]  # every method fitted the same 2 x 3 x 2 problems; no speed judged at --quick
    assert {r["fits"] for r in many["rows"].values()} == {12} and many["rows"]["batched cb_core"]["converged"] == 12
    assert many["targets"]["many_concepts"]["met"] == "not measured: --quick sizes"
    cost = written["step_cost"]
    assert len(cost["cold_s"]) == len(cost["naive_padded_s"]) == 3 and cost["candidates"] == 8
    for name in ("torch", "jax"):  # at least 10 warm steps, after the warm-up, compiles apart
        row = cost["warm"][name]
        assert row["warm_steps"] == len(row["warm_s"]) >= 10 and len(row["warmup_s"]) == 2
        assert len(row["compiled_s"]) == len(row["compiled_at_step"]) and all(k > 2 for k in row["compiled_at_step"])
        assert row["max_s"] == max(row["warm_s"]) and min(row["warm_s"]) <= row["median_s"] <= row["max_s"]
        busy = cost["busy"][name]  # the profilers ran; a CPU trace holds no device interval
        assert len(busy["profiled_wall_s"]) == 2 and busy["device_events"] == 0
        assert busy["busy_share"] is None and busy["reason"] == NOT_MEASURED
    assert cost["jax_programs"] >= 1 and cost["jax_over_torch_warm"] == cost["warm"]["jax"]["median_s"] / cost[
        "warm"]["torch"]["median_s"]
    assert sorted(cost["targets"]) == TARGET_NAMES and {t["met"] for t in cost["targets"].values()} == {NOT_MEASURED}
    assert cost["targets"]["jax_warm_median_s"]["value"] == cost["warm"]["jax"]["median_s"]
    many = cost["batched"]["torch"]  # 8 episodes' steps in one score_many call against 8 calls
    assert many["episodes"] == 8 and len(many["score_many_s"]) == len(many["one_by_one_s"]) == 2
    assert many["score_many_steps_per_s"] == 8 / statistics.median(many["score_many_s"])
    assert many["log_q_gap"] <= 1e-4  # float32: the same scores either way
    assert cost["batched"]["jax"]["score_many_steps_per_s"] is None and cost["batched"]["jax"]["reason"]
    jax = written["jax"]  # the JAX backend against the PyTorch naive forward
    for context, row in jax["float32"].items():
        assert sorted(row) == ["batched", "packed", "tree"], context
        assert all(gap["log_q"] <= 1e-4 and gap["hidden_rel"] <= 1e-4 for gap in row.values()), (context, row)


@pytest.mark.slow
def test_gpu_check_mesh_section_runs_on_simulated_devices(tmp_path):
    """``--only mesh`` with four simulated CPU devices: meshes of 1, 2 and 4 against one device."""
    import os
    import subprocess
    import sys

    out = tmp_path / "mesh.json"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--device", "cpu", "--only", "mesh", "--out",
                           str(out)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    written = json.loads(out.read_text())
    assert sorted(written) == ["commit", "date", "environment", "mesh", "quick", "seconds", "verdicts"]
    assert written["verdicts"] == {"mesh_exactness_float32": True, "mesh_same_decisions": True,
                                   "mesh_weights_split": True}
    meshes = written["mesh"]["meshes"]
    assert sorted(meshes) == ["1", "2", "4"] and [meshes[n]["q_rows_per_device"] for n in "124"] == [[128], [64], [32]]
    assert all(row["log_q"] <= 1e-4 for row in meshes.values())
