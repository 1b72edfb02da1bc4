"""`cb-agent run`, `fit-concepts` and `eval-decisions` end to end with doubles: results lines, resume, the
run configuration, cached concepts and the printed progress.
"""

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

import agent_shell.lm
import envs
from agent_doubles import FakeLM, ScriptedEnv
from agent_shell.cli import main
from agent_shell.results import read_results
from agent_shell.statistics import wilson_interval


@pytest.fixture()
def doubles(monkeypatch, tmp_path):
    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path / "cache"))
    lms = []

    def load(name=None, dtype="bfloat16", **_):
        lms.append(FakeLM([" think: plan", " go to desk 1", " take key 1 from desk 1", " go to door 1"]))
        return lms[-1]

    monkeypatch.setattr(envs, "make_env", lambda name, **kw: ScriptedEnv(expert_looks=True))
    monkeypatch.setattr(agent_shell.lm, "load_language_model", load)
    return lms


def test_run_report_and_resume_through_the_cli(tmp_path, doubles):
    out = tmp_path / "run"
    args = ["run", "--env", "textworld", "--split", "test", "--agent", "react", "--agent", "prior-only",
            "--per-type", "1", "--max-steps", "4", "--out-dir", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    records = read_results(out / "results.jsonl")
    assert sorted((r["agent"], r["task_id"]) for r in records) == [
        ("prior-only", "a/1"), ("prior-only", "b/1"), ("react", "a/1"), ("react", "b/1")]
    assert all(r["budget"] == 4 and r["model"] == "fake-lm" for r in records)
    assert "expert steps" not in res.output  # no concepts were needed
    assert (out / "results.png").exists()
    n_loads = len(doubles)
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 1 and "Error:" in again.output and "--resume" in again.output
    assert len(doubles) == n_loads  # refused before loading the backbone
    mixed = CliRunner().invoke(main, args + ["--resume", "--history", "causal"])
    assert mixed.exit_code == 1 and "rendering='raw'" in mixed.output and "rendering='causal'" in mixed.output
    resumed = CliRunner().invoke(main, args + ["--resume"])
    assert resumed.exit_code == 0 and len(read_results(out / "results.jsonl")) == 4
    # a resume with every episode finished loads nothing (no backbone, no demonstrations) and says so
    assert "nothing left to play: all 4 episodes" in " ".join(resumed.output.split()) and len(doubles) == n_loads
    more = CliRunner().invoke(main, [a if a != "1" else "2" for a in args] + ["--resume"])  # --per-type 2
    assert more.exit_code == 0 and len(doubles) > n_loads, more.output  # episodes left: set up and play them
    pairs = [(r["agent"], r["task_id"]) for r in read_results(out / "results.jsonl")]
    assert len(pairs) == len(set(pairs)) and sorted(pairs) == [  # the new game played, nothing replayed
        (agent, task) for agent in ("prior-only", "react") for task in ("a/1", "a/2", "b/1")]
    rep = CliRunner().invoke(main, ["report", str(out / "results.jsonl"), "--chart", str(tmp_path / "c.png")])
    assert rep.exit_code == 0 and "prior-only" in rep.output and (tmp_path / "c.png").exists()


def test_cb_agent_run_fits_concepts_and_reports_skipped_expert_steps(tmp_path, doubles):
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["run", "--env", "textworld", "--split", "test", "--agent", "cb-agent",
                                    "--games", "1", "--max-steps", "3", "--out-dir", str(out)])
    assert res.exit_code == 0, res.output
    assert "4 of 8 expert steps (50.0%) were no fitting target (look x4)" in " ".join(res.output.split())
    (rec,) = read_results(out / "results.jsonl")
    assert rec["agent"] == "cb-agent" and rec["concepts_dir"] and rec["n_candidates"]
    assert rec["device"] == "cpu" and "backbone: " in res.output  # where the backbone ran, for the record
    res = CliRunner().invoke(main, ["eval-decisions", "--env", "textworld", "--heldout-split", "train",
                                    "--demos-per-type", "1", "--heldout-per-type", "1",
                                    "--out", str(tmp_path / "acc.json")])
    assert res.exit_code == 0, res.output
    import orjson

    written = orjson.loads((tmp_path / "acc.json").read_bytes())
    rows = written["rows"]
    assert [r["task_type"] for r in rows] == ["fetch", "open", "all"] and rows[-1]["decisions"] == 2 + 3
    assert len(written["decisions"]) == 5  # every held-out decision, with its terms
    all_row = rows[-1]
    assert all_row["hits_concept"] == sum(r["hits_concept"] for r in rows[:2])
    assert all_row["acc_concept"] == all_row["hits_concept"] / 5
    assert all_row["ci_concept"][0] <= all_row["acc_concept"] <= all_row["ci_concept"][1]
    assert tuple(all_row["ci_prior"]) == wilson_interval(all_row["hits_prior"], 5)


def test_fit_concepts_writes_one_concept_per_type_and_copies_them(tmp_path, doubles):
    import cb_core

    res = CliRunner().invoke(main, ["fit-concepts", "--env", "textworld", "--demos-per-type", "2", "--lam", "0.5",
                                    "--out-dir", str(tmp_path / "concepts")])
    assert res.exit_code == 0, res.output
    (folder,) = (tmp_path / "cache" / "concepts").iterdir()
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in (tmp_path / "concepts").iterdir()) \
        == ["fetch.safetensors", "open.safetensors"]
    meta = cb_core.Concept.load(tmp_path / "concepts" / "open.safetensors").metadata
    assert meta["lam"] == 0.5 and meta["trajectories"] == ["b/1", "b/2"] and meta["fit"]["converged"]
    assert meta["n_decisions"] == 6 and meta["skipped_actions"] == {"look": 6}
    # the printed table: per type, trajectories, decisions and skipped expert steps
    lines = {line.split()[1]: line for line in res.output.splitlines() if line.split()[1:2] in (["fetch"], ["open"])}
    assert "6 of 12 (look x6)" in lines["open"] and "4 of 8 (look x4)" in lines["fetch"]
    assert "2 (+0 lost)" in lines["open"] and "concepts copied to" in res.output
    assert len(doubles) == 1  # one backbone load
    # a run over both task types with the same settings acts with exactly these concepts (same
    # cache key): no refit, no new folder
    res = CliRunner().invoke(main, ["run", "--env", "textworld", "--split", "test", "--agent", "cb-agent",
                                    "--all-games", "--max-steps", "2", "--demos-per-type", "2", "--lam", "0.5",
                                    "--out-dir", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    records = read_results(tmp_path / "run" / "results.jsonl")
    assert {r["task_type"] for r in records} == {"fetch", "open"}
    assert all(r["concepts_dir"] == str(folder) for r in records)
    assert [p.name for p in (tmp_path / "cache" / "concepts").iterdir()] == [folder.name]


def test_run_refuses_a_cached_concept_fitted_in_another_dtype(tmp_path, doubles):
    """The concept cache's folder is keyed by the backbone's dtype, so a mismatch means a concept
    file that was fitted another way: ``run`` refuses it, naming the field, before any episode."""
    import cb_core

    args = ["run", "--env", "textworld", "--split", "test", "--agent", "cb-agent", "--games", "1",
            "--max-steps", "2", "--out-dir", str(tmp_path / "run")]
    assert CliRunner().invoke(main, args).exit_code == 0
    (folder,) = (tmp_path / "cache" / "concepts").iterdir()
    for path in folder.glob("*.safetensors"):
        c = cb_core.Concept.load(path)
        path.write_bytes(cb_core.Concept(c.alpha, c.gamma, c.eps, {**c.metadata, "features": {
            **c.metadata["features"], "dtype": "bfloat16"}}).to_bytes())
    res = CliRunner().invoke(main, [*args[:-1], str(tmp_path / "again")])
    assert res.exit_code != 0
    assert "dtype='bfloat16', but acting uses ''" in str(res.exception) + res.output
    assert not (tmp_path / "again" / "results.jsonl").exists()


def test_run_config_is_validated_once_and_frozen():
    from dataclasses import FrozenInstanceError

    from agent_shell.configure import resolve
    from agent_shell.run_config import RunConfig

    for bad, culprit in (({"budget": 0}, "budget=0"), ({"agents": ("gpt",)}, "unknown agent 'gpt'"),
                         ({"rendering": "sideways"}, "sideways"), ({"layout": "html"}, "html"),
                         ({"dtype": "int8"}, "int8"), ({"lam": 0.0}, "lam=0.0"), ({"action_space": "wide"}, "wide"),
                         ({"fit_candidates": 1}, "fit_candidates=1"), ({"fit_candidates": -3}, "fit_candidates=-3")):
        with pytest.raises(ValueError, match=culprit):
            resolve(RunConfig(**bad))
    config = resolve(RunConfig(agents=("react", "react", "prior-only"), dtype="fp32", game_ids=["a/1"]))
    assert config.agents == ("react", "prior-only") and config.dtype == "float32" and config.game_ids == ("a/1",)
    assert list(config.settings()) == list(RunConfig.SETTINGS) and config.settings()["dtype"] == "float32"
    with pytest.raises(FrozenInstanceError):
        config.budget = 3
    res = CliRunner().invoke(main, ["run", "--env", "textworld", "--per-type", "-1"])
    assert res.exit_code == 2 and "per-type" in res.output


def test_every_results_line_records_the_run_config_and_resume_compares_it(tmp_path, doubles):
    out = tmp_path / "run"
    args = ["run", "--env", "textworld", "--split", "test", "--agent", "react", "--per-type", "1", "--games", "1",
            "--max-steps", "3", "--lam", "0.5", "--out-dir", str(out)]
    assert CliRunner().invoke(main, args).exit_code == 0
    (rec,) = read_results(out / "results.jsonl")
    assert {k: rec[k] for k in ("env", "split", "budget", "lam", "gamma", "demo_split", "reflexion_trials", "seed")} \
        == {"env": "textworld", "split": "test", "budget": 3, "lam": 0.5, "gamma": 0.8, "demo_split": "train",
            "reflexion_trials": 2, "seed": 0}
    other = CliRunner().invoke(main, [*args[:-4], "--lam", "2", "--out-dir", str(out), "--resume"])
    assert other.exit_code == 1 and "lam=0.5" in other.output and "lam=2.0" in other.output
    # a file written before these settings were recorded resumes: missing fields are not compared
    old = {k: v for k, v in rec.items() if k not in ("lam", "gamma", "demo_split", "reflexion_trials")}
    (out / "results.jsonl").write_bytes(orjson.dumps(old) + b"\n")
    again = CliRunner().invoke(main, [*args[:-4], "--lam", "2", "--out-dir", str(out), "--resume"])
    assert again.exit_code == 0, again.output
    # a field with a value before it was recorded counts as that value: a record without
    # fit_candidates was fitted on whole candidate sets, so a capped run may not continue it
    (out / "results.jsonl").write_bytes(orjson.dumps({k: v for k, v in rec.items() if k != "fit_candidates"}) + b"\n")
    capped = CliRunner().invoke(main, [*args, "--fit-candidates", "64", "--resume"])
    assert capped.exit_code == 1 and "fit_candidates=0" in capped.output and "fit_candidates=64" in capped.output
    assert rec["fit_candidates"] == 0


def test_run_prints_plain_lines_off_a_terminal(tmp_path, doubles):
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["run", "--env", "textworld", "--split", "test", "--agent", "react", "--per-type",
                                    "1", "--max-steps", "4", "--out-dir", str(out)])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("react ")]
    assert len(lines) == 2 and all(" steps=" in ln and " s/step=" in ln for ln in lines)
    assert lines[0].split()[1] == "a/1" and lines[0].split()[2] in ("won", "lost")
    # a torn last line: --resume moves it aside and keeps the rest byte for byte
    results = out / "results.jsonl"
    whole = results.read_bytes()
    with open(results, "ab") as fh:
        fh.write(b'{"agent": "react", "ta')
    res = CliRunner().invoke(main, ["run", "--env", "textworld", "--split", "test", "--agent", "react", "--per-type",
                                    "1", "--max-steps", "4", "--out-dir", str(out), "--resume"])
    assert res.exit_code == 0 and f"repaired {results}: line 3 (truncated line" in res.output
    assert results.read_bytes() == whole and (out / "results.jsonl.torn").read_bytes() == b'{"agent": "react", "ta\n'


def test_eval_decisions_rows_carry_wilson_intervals(tmp_path, doubles):
    import orjson

    res = CliRunner().invoke(main, ["eval-decisions", "--env", "textworld", "--heldout-split", "train",
                                    "--demos-per-type", "1", "--heldout-per-type", "1", "--out", str(tmp_path / "a.json")])
    assert res.exit_code == 0, res.output
    out = orjson.loads((tmp_path / "a.json").read_bytes())
    rows = out["rows"]
    for r in rows:
        for name in ("prior", "concept"):
            assert r[f"ci_{name}"] == list(wilson_interval(r[f"hits_{name}"], r["decisions"]))
            assert r[f"acc_{name}"] == r[f"hits_{name}"] / r["decisions"]
    assert "95% Wilson" in res.output and "% [" in res.output
    # every held-out decision with its terms: the argmaxes hit the expert as often as the rows count
    decisions, total = out["decisions"], rows[-1]
    assert out["schema"] == "cb-agent/eval-decisions-v1" and len(decisions) == total["decisions"]
    for name, key in (("prior", "prior"), ("concept", "log_p")):
        hits = sum(int(np.argmax(d[key])) == d["expert"] for d in decisions if d["concept"] is not None
                   or name == "prior")
        assert hits == total[f"hits_{name}"]
    for d in decisions:
        assert len(d["candidates"]) == len(d["prior"]) == len(d["log_p"]) and 0 <= d["expert"] < len(d["candidates"])
        if d["concept"] is not None:  # log P is the sum of the terms, normalised over the set
            z = np.add(d["prior"], d["concept"])
            assert d["log_p"] == pytest.approx(list(z - np.log(np.exp(z).sum())), abs=3e-3)


@pytest.mark.parametrize("failing", ["partial state", "results line"])
def test_a_full_disk_stops_the_run_in_one_line_and_resume_continues(tmp_path, doubles, monkeypatch, failing):
    """An output that cannot be written (ENOSPC) is no episode fault: no retry, no error record, one
    line naming the file and the free space; the same command with --resume then plays the rest."""
    import errno

    import cb_io.storage

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if failing == "partial state":
        monkeypatch.setattr(cb_io.storage.tempfile, "mkstemp", full)
    else:
        monkeypatch.setattr(cb_io.storage.os, "fsync", full)
    out = tmp_path / "run"
    args = ["run", "--env", "textworld", "--split", "test", "--agent", "react", "--per-type", "1",
            "--max-steps", "3", "--out-dir", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1, (res.output, res.exception)
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("Error:")]
    assert "cannot write" in line and "No space left on device" in line and "bytes free" in line
    assert "retried" not in res.output and "Traceback" not in res.output
    monkeypatch.undo()
    assert not (out / "results.jsonl").exists() or not read_results(out / "results.jsonl")  # no error record
    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(envs, "make_env", lambda name, **kw: ScriptedEnv(expert_looks=True))
    monkeypatch.setattr(agent_shell.lm, "load_language_model", lambda name=None, dtype="bfloat16", **_: FakeLM(
        [" go to desk 1"]))
    resumed = CliRunner().invoke(main, args + ["--resume"])
    assert resumed.exit_code == 0, resumed.output
    records = read_results(out / "results.jsonl")
    assert sorted(r["task_id"] for r in records) == ["a/1", "b/1"] and not any(r.get("error") for r in records)


def test_resume_plays_an_error_record_again_unless_told_to_keep_it(tmp_path, doubles):
    """An episode an engine fault or the time limit ended is played again by --resume (a restart may
    fix it); the replay's record replaces the error record in every reading; --keep-errors keeps it."""
    from agent_shell.results import unique_episodes

    out = tmp_path / "run"
    args = ["run", "--env", "textworld", "--split", "test", "--agent", "react", "--per-type", "1",
            "--max-steps", "3", "--out-dir", str(out)]
    assert CliRunner().invoke(main, args).exit_code == 0
    lines = (out / "results.jsonl").read_bytes().splitlines()
    first = orjson.loads(lines[0])
    broken = {**first, "success": False, "trials": [],
              "error": {"type": "EngineError", "message": "EngineError: the engine crashed", "trial": 0, "step": 0}}
    (out / "results.jsonl").write_bytes(orjson.dumps(broken) + b"\n" + lines[1] + b"\n")
    kept = CliRunner().invoke(main, args + ["--resume", "--keep-errors"])
    assert kept.exit_code == 0 and "nothing left to play" in " ".join(kept.output.split()), kept.output
    resumed = CliRunner().invoke(main, args + ["--resume"])
    assert resumed.exit_code == 0, resumed.output
    records = read_results(out / "results.jsonl")
    assert len(records) == 3 and records[0].get("error") and not records[2].get("error")
    assert records[2]["task_id"] == first["task_id"]
    episodes, warnings_ = unique_episodes(records)
    assert [(r["task_id"], bool(r.get("error"))) for r in episodes] == [(first["task_id"], False),
                                                                       (records[1]["task_id"], False)]
    assert warnings_ == []
    again = CliRunner().invoke(main, args + ["--resume"])  # the replayed episode is finished now
    assert again.exit_code == 0 and "nothing left to play" in " ".join(again.output.split())
