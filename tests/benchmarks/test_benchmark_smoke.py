"""Every benchmark script runs end to end on a tiny size (``--tiny``), so none of them can rot; the
default suite runs all but the few listed as not in it (slow or GPU-only ones).

Smoke tests, not measurements: they check that each script finishes, writes its figures, and
that the figures are well formed (every method timed, every ratio named by its baseline). No
speed is asserted (speed claims live in the benchmarks' own runs). The scripts are run in this
process (``main(argv)``), so torch and JAX are imported once.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import re
from pathlib import Path

import orjson
import pytest

from envs.trajectory import Step, Trajectory

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: script -> the default-suite test ("file::test") that runs it on a tiny input
SMOKE_TESTS = {
    "routing_speed": "tests/benchmarks/test_benchmark_smoke.py::test_routing_speed_tiny",
    "sampling_speed": "tests/benchmarks/test_benchmark_smoke.py::test_sampling_speed_tiny",
    "scoring_speed": "tests/benchmarks/test_benchmark_smoke.py::test_scoring_speed_tiny",
    "step_cost": "tests/benchmarks/test_benchmark_smoke.py::test_step_cost_tiny",
    "replay_actions": "tests/benchmarks/test_replay_actions.py::test_main_reads_compressed_references_and_exits_one_on_a_difference",
}
#: scripts no default-suite test runs (known gaps), and where they are run instead
NOT_IN_THE_DEFAULT_SUITE = {
    "fit_speed": "test_fit_speed_tiny (slow marker: a worker process per method)",
    "episode_throughput": "test_episode_throughput_tiny (slow marker: real ALFWorld and SmolLM2 on Ray)",
    "vllm_agreement": "tests/lm/test_vllm_gpu.py (gpu marker: needs CUDA and the vllm extra)",
}
ROOT = BENCHMARKS.parent
DESELECTED = {"slow", "gpu"}  # pyproject's addopts: -m 'not slow and not gpu'


def markers(node: ast.AST) -> set[str]:
    """``pytest.mark.NAME`` names among a function's decorators or a module's ``pytestmark``."""
    out = set()
    for dec in getattr(node, "decorator_list", [node]):
        for sub in ast.walk(dec):
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark":
                out.add(sub.attr)
    return out


def test_every_benchmark_script_has_a_smoke_test_the_default_suite_runs():
    """A new script fails this until a default-suite test runs it (or it is listed as a gap): each
    named test exists, is selected by the default markers, and calls a ``main`` in a file that
    names its script."""
    assert sorted(p.stem for p in BENCHMARKS.glob("[!_]*.py")) == sorted([*SMOKE_TESTS, *NOT_IN_THE_DEFAULT_SUITE])
    assert not set(SMOKE_TESTS) & set(NOT_IN_THE_DEFAULT_SUITE)
    assert pyproject_deselects() == DESELECTED
    for script, node_id in SMOKE_TESTS.items():
        path, name = node_id.split("::")
        tree = ast.parse((ROOT / path).read_text())
        module_marks = {m for n in tree.body if isinstance(n, ast.Assign)
                        and any(getattr(t, "id", None) == "pytestmark" for t in n.targets) for m in markers(n.value)}
        tests = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert name in tests, f"{node_id} does not exist"
        test = tests[name]
        assert not (markers(test) | module_marks) & DESELECTED, f"{node_id} is not in the default suite"
        text = (ROOT / path).read_text()
        assert f'"{script}"' in text or f"{script}.py" in text, f"{path} does not name {script}"
        assert ".main(" in ast.get_source_segment(text, test), f"{node_id} runs no script's main()"


def pyproject_deselects() -> set[str]:
    import tomllib

    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    return set(re.findall(r"not (\w+)", addopts))


def test_scoring_speed_tiny(tmp_path, capsys):
    """In float32, so every method that scores is checked against the script's naive re-encoding
    (one full forward per candidate, written apart from the backend) to float32 rounding."""
    out = tmp_path / "scoring.json"
    assert load("scoring_speed").main(["--tiny", "--dtype", "float32", "--compare-dtype", "bfloat16",
                                       "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    setup, (key, result) = data["setup"], *data["results"].items()
    other = "bfloat16"
    assert key == "ctx96_cand3" and setup["rounds"] == 1 and setup["compare_dtypes"] == [other]
    assert setup["dtype"] == "float32"
    methods = result["methods"]
    assert sorted(methods) == sorted(["naive", "batched", "backend-batched", "backend", "floor", "backend-warm",
                                      f"backend@{other}"])
    for row in methods.values():  # one warm-up (untimed) and one timed round each
        assert len(row["all_seconds"]) == 1 and row["seconds"] > 0
    gaps = {name: row["max_abs_log_q_gap_to_naive"] for name, row in methods.items()}
    assert gaps["naive"] == 0.0 and gaps["floor"] is None  # the floor scores nothing
    for name in ("batched", "backend-batched", "backend", "backend-warm"):
        assert gaps[name] < 1e-3, (name, gaps[name])  # nats, the sum over a candidate's tokens
    assert len(methods["naive"]["log_q"]) == 3 and all(q < 0 for q in methods["naive"]["log_q"])
    assert sorted(result["ratios"]) == sorted(["speedup_vs_naive", "speedup_vs_batched", "speedup_vs_cached_batched",
                                               "ratio_to_floor", f"backend@{other}_time_over_backend"])
    assert math.isclose(result["ratios"]["speedup_vs_cached_batched"],
                        methods["backend-batched"]["seconds"] / methods["backend"]["seconds"])
    printed = capsys.readouterr().out
    assert "cached context + batched candidates (backend-batched) takes" in printed
    assert f"backend in {other} takes" in printed


def test_scoring_speed_reports_no_ratio_to_a_baseline_it_did_not_measure():
    """``--fast-only`` leaves naive and batched re-encoding out: no ratio to them may appear."""
    scoring = load("scoring_speed")
    rows = {name: {"seconds": s, "tokens_per_s": 1.0, "peak_mib": 0.0, "max_abs_log_q_gap_to_naive": None}
            for name, s in [("backend-batched", 3.0), ("backend", 2.0), ("floor", 1.0), ("backend-warm", 0.5)]}
    ratios = scoring.ratios(rows)
    assert ratios == {"speedup_vs_cached_batched": 1.5, "ratio_to_floor": 2.0}
    setup = {"model": "m", "dtype": "float32", "device": "cpu", "torch_threads": 1, "cpu_count": 2, "rounds": 3,
             "load_average_at_start": [0.0]}
    text = scoring.report({"setup": setup, "results": {"ctx64_cand3": {
        "context_tokens": 64, "candidate_tokens": 9, "methods": rows, "ratios": ratios}}})
    assert "cached context + batched candidates (backend-batched) takes 1.5x its time" in text
    assert "re-encoding" not in text and "target" not in text


def test_routing_speed_tiny(tmp_path, capsys):
    steps = [Step("env", "go to cabinet 1", "The cabinet 1 is closed.", ["go to cabinet 1", "look"], False, False, 0.0),
             Step("think", "think: I should open it.", "OK.", None, False, False, 0.0),
             Step("env", "open cabinet 1", "You open the cabinet 1. It is empty.", ["open cabinet 1"], False, False, 0.0)]
    traj = Trajectory("alfworld", "pick_and_place_simple-Mug-None-Shelf-1/trial_1", "pick_and_place_simple",
                      "Your task is to: put a mug in shelf.", "You are in the middle of a room.", steps, False, 0.0)
    results = tmp_path / "results.jsonl"
    results.write_bytes(orjson.dumps({"env": "alfworld", "agent": "react", "task_id": traj.task_id,
                                      "success": False, "trials": [{"trajectory": traj.to_record()}]}) + b"\n")
    out = tmp_path / "routing.json"
    assert load("routing_speed").main([str(results), "--tiny", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["calls"] == 3 and data["same_step_kind"] == "3/3" and data["same_reply_with_drafts"] == "3/3"
    assert [len(data["all_seconds"][m]) for m in ("full", "full-plain", "peek")] == [3, 3, 3]
    assert data["speedup_median"] == data["full_median_s"] / data["peek_median_s"]
    assert data["draft_speedup_median"] == data["full_plain_median_s"] / data["full_median_s"]
    passes = data["passes_per_call"]
    assert 1 <= passes["full"] <= passes["full-plain"]


def test_sampling_speed_tiny(tmp_path):
    steps = [Step("env", "open door to kitchen", "The door is now open.", [], False, False, 0.0),
             Step("env", "go to kitchen", "You move to the kitchen.", [], False, False, 0.0)]
    traj = Trajectory("scienceworld", "boil/21", "boil", "Your task is to boil water.", "This room is called the hallway.",
                      steps, False, 0.0)
    results = tmp_path / "results.jsonl"
    results.write_bytes(orjson.dumps({"env": "scienceworld", "agent": "cb-agent", "task_id": traj.task_id,
                                      "success": False, "trials": [{"trajectory": traj.to_record()}]}) + b"\n")
    out = tmp_path / "sampling.json"
    assert load("sampling_speed").main([str(results), "--tiny", "--dtype", "float32", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["calls"] == 2 and data["replies_per_call"] == 4 and data["tokens_per_reply"] == 4
    assert [len(data["all_seconds"][m]) for m in ("shared", "copies")] == [2, 2]
    assert data["copies_over_shared_median"] == data["copies_median_s"] / data["shared_median_s"]
    assert data["same_replies"] == "2/2" and data["dtype"] == "float32"  # bfloat16 rounds the two paths apart
    assert data["prompt_tokens_median"] > 20


def test_step_cost_tiny(tmp_path):
    """Three expert trajectories of one type: two are the demonstrations, the third is replayed."""
    cands = ["go to cabinet 1", "go to cabinet 2", "go to countertop 1", "open cabinet 1", "look"]
    steps = [Step("env", "go to cabinet 1", "The cabinet 1 is closed.", cands, False, False, 0.0),
             Step("env", "open cabinet 1", "You open the cabinet 1. It is empty.", cands, False, False, 0.0),
             Step("env", "go to countertop 1", "On the countertop 1, you see a mug 1.", cands, False, False, 0.0)]
    expert = tmp_path / "train.jsonl"
    expert.write_bytes(b"".join(
        orjson.dumps(Trajectory("alfworld", f"pick_and_place_simple-Mug-None-Shelf-1/trial_{i}", "pick_and_place_simple",
                                "Your task is to: put a mug in shelf.", "You are in the middle of a room.", steps,
                                True, 1.0).to_record()) + b"\n" for i in range(3)))
    out = tmp_path / "step_cost.json"
    assert load("step_cost").main(["--expert", str(expert), "--tiny", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["steps"] == 3 and data["floor_passes_per_step"] == 1
    for layout in ("tree", "packed"):
        assert data[f"cb_agent_{layout}_s_per_step"] > 0 and data[f"cb_agent_{layout}_passes_per_step"] >= 2
        assert math.isclose(data[f"ratio_{layout}_to_floor"],
                            data[f"cb_agent_{layout}_s_per_step"] / data["floor_s_per_step"])
    assert math.isclose(data["packed_over_tree"], data["cb_agent_packed_s_per_step"] / data["cb_agent_tree_s_per_step"])
    # "go to c..." is shared by three candidates: the tree encodes fewer tokens than the candidates have
    assert 0 < data["mean_tree_nodes_per_step"] < data["mean_candidate_tokens_per_step"]


@pytest.mark.slow
def test_fit_speed_tiny(tmp_path):
    """Slow: one worker process per method, each compiling its programs, and the CLI timings
    start further processes."""
    out = tmp_path / "fit.json"
    load("fit_speed").main(["--tiny", "--json", str(out)])
    data = json.loads(out.read_text())
    methods = ["torch adam", "scipy L-BFGS-B f64", "cb_core subspace", "cb_core newton", "cb_core lbfgs", "cb_core adam"]
    assert [(p["n"], p["d"], p["regime"]) for p in data["problems"]] == [(12, 16, "well"), (12, 16, "today")]
    for problem in data["problems"]:
        assert list(problem["rows"]) == methods
        for row in problem["rows"].values():
            assert row["rounds"] == 1 and row["seconds"] > 0
    assert [(c["n"], c["d"]) for c in data["cli"]] == [(12, 16)] and data["six_concepts"]


@pytest.mark.slow
def test_episode_throughput_tiny(tmp_path):
    """Both parts on Ray with the real ALFWorld and SmolLM2 (slow: two workers each load both)."""
    out = tmp_path / "throughput.json"
    assert load("episode_throughput").main(["--tiny", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    workers = figures["workers"]
    assert workers["episodes"] == 2 and workers["budget"] == 2
    for n in (1, 2):
        row = workers[f"workers_{n}"]
        assert 0 < row["playing_s"] <= row["wall_s"] and row["steps"] == 4  # 2 episodes x 2 steps, none won
        assert row["episodes_per_hour_playing"] == pytest.approx(3600 * 2 / row["playing_s"], rel=0.01)
    assert workers["speedup_2_vs_1"] == pytest.approx(workers["workers_1"]["wall_s"] / workers["workers_2"]["wall_s"],
                                                      abs=0.01)
    actor = figures["lm_actor"]
    for k in (4, 8):
        for label in ("batched", "per_episode"):
            assert actor[f"{label}_{k}"]["calls_per_s"] > 0 and actor[f"{label}_{k}"]["mean_latency_s"] > 0
        assert f"throughput_ratio_{k}" in actor
    assert actor["batch_sizes"] and max(actor["batch_sizes"]) <= 16
