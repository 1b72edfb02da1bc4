"""``cb-agent run --workers 2`` (the path Tables 1 and 2 were made with) through the CLI, on
ScriptedEnv and a looping FakeLM in the driver and in every Ray worker: the records equal
``--workers 1``'s, and a driver killed mid-run resumes without losing or duplicating an episode.
Both are slow-marked (each Ray worker sets up the whole pipeline); ``--env textworld`` only passes
the option's check, the doubles stand in for every environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'cb-agent[ray]')")

import parallel_doubles  # noqa: E402
from agent_shell.cli import main  # noqa: E402
from agent_shell.results import read_results  # noqa: E402
from test_runner import untimed  # noqa: E402

GAMES = ["a/1", "a/2", "a/3", "b/1", "b/2"]
EPISODES = {(agent, game) for agent in ("react", "prior-only") for game in GAMES}


def run_args(tmp_path: Path, out: Path, workers: int, *extra: str) -> list[str]:
    args = ["run", "--env", "textworld", "--split", "test", "--agent", "react", "--agent", "prior-only",
            "--demos-per-type", "1", "--max-steps", "6", "--dtype", "float32", "--workers", str(workers),
            "--cache-dir", str(tmp_path / "cache"), "--out-dir", str(out), *extra]
    for game in GAMES:
        args += ["--game", game]
    return args


def by_episode(path: Path) -> dict:
    out = {}
    for r in read_results(path):
        key = (r["agent"], r["task_id"])
        assert key not in out, f"duplicated episode {key}"
        out[key] = untimed(r)
    return out


def use_doubles(mp: pytest.MonkeyPatch, install=None) -> None:
    """The doubles (``install``'s, default :func:`parallel_doubles.install_doubles`) in this process
    until ``mp`` is undone, and the workers' player factory."""
    import agent_shell.lm
    import agent_shell.pipeline
    import envs

    for module, name in ((envs, "make_env"), (agent_shell.lm, "load_language_model"),
                         (agent_shell.pipeline, "build_players")):
        mp.setattr(module, name, getattr(module, name))  # restored when mp is undone
    parallel_doubles.use_doubles_in_run_command(install)


@pytest.fixture()
def doubles(monkeypatch):
    use_doubles(monkeypatch)


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory):
    """The same run with --workers 1 (in this process): the reference records."""
    tmp = tmp_path_factory.mktemp("one")
    with pytest.MonkeyPatch.context() as mp:
        use_doubles(mp)
        res = CliRunner().invoke(main, run_args(tmp, tmp / "out", 1))
    assert res.exit_code == 0, res.output + repr(res.exception)
    records = by_episode(tmp / "out" / "results.jsonl")
    assert set(records) == EPISODES and any(r["success"] for r in records.values())
    return records


@pytest.mark.slow  # every Ray worker sets up the whole pipeline (torch included) before its first episode
def test_run_with_two_workers_gives_the_records_of_one_worker(ray_cluster, doubles, one_worker, tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(main, run_args(tmp_path, out, 2))
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert by_episode(out / "results.jsonl") == one_worker
    assert not (out / "results.jsonl.partial").exists()
    again = CliRunner().invoke(main, run_args(tmp_path, out, 2, "--resume"))
    assert again.exit_code == 0 and "nothing left to play" in again.output, again.output
    assert len(read_results(out / "results.jsonl")) == len(EPISODES)


@pytest.mark.slow  # a second driver process: its start, its connection to Ray and its workers' set-up
def test_a_killed_parallel_driver_resumes_without_loss_or_duplication(ray_cluster, doubles, one_worker, tmp_path):
    """The driver (a process of its own, on the tests' shared Ray cluster) dies right after storing its
    third record; ``--resume`` plays the other seven: every episode once, as ``--workers 1`` plays it."""
    out = tmp_path / "out"
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parent.parent)])}
    address = ray_cluster.get_runtime_context().gcs_address
    killed = subprocess.run([sys.executable, str(here / "parallel_doubles.py"), "3",
                             *run_args(tmp_path, out, 2, "--ray-address", address)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert killed.returncode == -9, killed.stdout + killed.stderr  # SIGKILL: the driver died mid-run
    first = by_episode(out / "results.jsonl")
    assert len(first) == 3 and set(first) < EPISODES
    res = CliRunner().invoke(main, run_args(tmp_path, out, 2, "--resume"))
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "finished episodes skipped (--resume)" in res.output
    assert by_episode(out / "results.jsonl") == one_worker


@pytest.mark.slow  # two improve runs, the second's rounds on Ray workers that each set up the pipeline
def test_improve_with_two_workers_gives_the_rounds_of_one_worker(ray_cluster, monkeypatch, tmp_path):
    """``cb-agent improve --labels expert --workers 2`` (training and evaluation games on Ray workers
    acting with the round's saved concepts) plays the episodes, fits the concepts and writes the
    round lines of ``--workers 1`` (in this process)."""
    from test_improve import episodes, improve_args, saved_concepts

    use_doubles(monkeypatch, parallel_doubles.install_improve_doubles)
    cache = ["--cache-dir", str(tmp_path / "cache")]
    one, two = tmp_path / "one", tmp_path / "two"
    res = CliRunner().invoke(main, improve_args(one, "--labels", "expert", *cache))
    assert res.exit_code == 0, res.output + repr(res.exception)
    res = CliRunner().invoke(main, improve_args(two, "--labels", "expert", "--workers", "2", *cache))
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert sorted(episodes(two)) == sorted(episodes(one))
    assert {f for f, *_ in episodes(one)} == {f"round-{k}/{n}.jsonl" for k in (0, 1, 2) for n in ("results", "train")
                                              if (k, n) != (0, "train")} | {"round-1/labelled.jsonl",
                                                                            "round-2/labelled.jsonl"}
    assert saved_concepts(two) == saved_concepts(one)
    strip = lambda line: {k: v for k, v in json.loads(line).items() if k != "concepts"}  # noqa: E731
    assert ([strip(x) for x in (two / "rounds.jsonl").read_text().splitlines()]
            == [strip(x) for x in (one / "rounds.jsonl").read_text().splitlines()])
