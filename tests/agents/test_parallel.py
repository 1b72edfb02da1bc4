"""Parallel episodes on a local Ray cluster: same records as a sequential run, a killed worker's
episode retried, a repeatedly failing one stored as an error record, nothing lost or duplicated."""

from __future__ import annotations

import functools
import sys

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'cb-agent[ray]')")

from agent_shell.parallel import run_parallel  # noqa: E402
from agent_shell.results import read_results  # noqa: E402
from agent_shell.runner import run_episodes  # noqa: E402
from parallel_doubles import AGENTS, make_players  # noqa: E402
from test_runner import untimed  # noqa: E402

TASKS = ["a/1", "a/2", "a/3", "b/1", "b/2"]
BUDGET = 6


@pytest.fixture(scope="module")
def cluster(ray_cluster):
    return ray_cluster


def by_episode(records):
    out = {}
    for r in records:
        key = (r["agent"], r["task_id"])
        assert key not in out, f"duplicated episode {key}"
        out[key] = untimed(r)
    return out


@pytest.fixture(scope="module")
def sequential(tmp_path_factory):
    out = tmp_path_factory.mktemp("seq") / "results.jsonl"
    env, agents = make_players()
    for name in AGENTS:
        run_episodes(env, agents[name], TASKS, out, BUDGET, meta={"seed": 0})
    return by_episode(read_results(out))


def test_parallel_records_equal_the_sequential_ones(cluster, sequential, tmp_path):
    out = tmp_path / "results.jsonl"
    lines = []
    summaries = run_parallel(make_players, AGENTS, TASKS, out, BUDGET, workers=2, meta={"seed": 0},
                             on_event=lines.append)
    assert by_episode(read_results(out)) == sequential
    assert len(sequential) == 10 and any(r["success"] for r in sequential.values())
    assert {n: len(s.records) for n, s in summaries.items()} == {"react": 5, "prior-only": 5}
    assert len(lines) == 10 and all(" steps=" in line for line in lines)
    # resume: nothing left to do, nothing duplicated
    again = run_parallel(make_players, AGENTS, TASKS, out, BUDGET, workers=2, resume=True, meta={"seed": 0})
    assert all(s.records == [] and len(s.skipped) == 5 for s in again.values())
    assert len(read_results(out)) == 10


def test_a_killed_worker_s_episode_is_retried_without_loss_or_duplication(cluster, sequential, tmp_path):
    out = tmp_path / "results.jsonl"
    players = functools.partial(make_players, kill_on=("a/2",), kills=1, marker_dir=str(tmp_path))
    lines = []
    run_parallel(players, AGENTS, TASKS, out, BUDGET, workers=2, meta={"seed": 0}, on_event=lines.append)
    assert (tmp_path / "a_2").read_text() == "xxx"  # killed once, then played by react and prior-only
    assert by_episode(read_results(out)) == sequential
    assert [line for line in lines if "retried" in line] == [
        "react a/2 retried (attempt 2/3): worker died: " + lines[[i for i, x in enumerate(lines)
                                                               if "retried" in x][0]].split("worker died: ")[1]]


def test_a_repeatedly_failing_episode_becomes_an_error_record(cluster, sequential, tmp_path):
    out = tmp_path / "results.jsonl"
    players = functools.partial(make_players, kill_on=("b/1",), kills=99, raise_on=("a/3",),
                                marker_dir=str(tmp_path))
    run_parallel(players, ["react"], TASKS, out, BUDGET, workers=2, meta={"seed": 0}, max_attempts=2,
                 task_type_of=lambda t: {"a": "fetch", "b": "open"}[t[0]])
    got = by_episode(read_results(out))
    assert sorted(got) == sorted(("react", t) for t in TASKS)
    for task in ("a/1", "a/2", "b/2"):
        assert got[("react", task)] == sequential[("react", task)]
    crashed, killed = got[("react", "a/3")], got[("react", "b/1")]
    # an engine fault ends its episode at once, as in the sequential runner (no retry)
    assert crashed["success"] is False and crashed["steps"] == 0 and crashed["task_type"] == "fetch"
    assert crashed["error"]["type"] == "EngineError" and "attempts" not in crashed["error"]
    assert crashed["error"]["message"].endswith("RuntimeError: engine crashed on a/3")
    env, agents = players()
    alone = tmp_path / "sequential.jsonl"
    run_episodes(env, agents["react"], ["a/3"], alone, BUDGET, meta={"seed": 0})
    assert by_episode(read_results(alone))[("react", "a/3")] == crashed
    # a worker that dies on every attempt: an error record after max_attempts
    assert killed["success"] is False and killed["steps"] == 0 and killed["task_type"] == "open"
    assert killed["error"]["attempts"] == 2 and all(r.startswith("worker died") for r in killed["error"]["reasons"])
    assert killed["error"]["type"] and killed["error"]["message"] == killed["error"]["reasons"][-1]
    # the error records count as finished: a resumed run duplicates nothing
    again = run_parallel(players, ["react"], TASKS, out, BUDGET, workers=2, resume=True, meta={"seed": 0})
    assert again["react"].records == [] and len(read_results(out)) == 5


def test_episodes_start_game_by_game(cluster, sequential, tmp_path):
    """Every agent plays a game before the next game starts (one worker: records in that order),
    so a run stopped part-way is a paired comparison; a resumed run keeps the order."""
    out = tmp_path / "results.jsonl"
    run_parallel(make_players, ["react"], TASKS[:1], out, BUDGET, workers=1, meta={"seed": 0})
    run_parallel(make_players, AGENTS, TASKS[:3], out, BUDGET, workers=1, resume=True, meta={"seed": 0})
    order = [(r["agent"], r["task_id"]) for r in read_results(out)]
    assert order == [("react", "a/1"), ("prior-only", "a/1"), ("react", "a/2"), ("prior-only", "a/2"),
                     ("react", "a/3"), ("prior-only", "a/3")]
    assert by_episode(read_results(out)) == {k: sequential[k] for k in order}


def test_with_task_types_games_start_round_robin_over_the_types(cluster, sequential, tmp_path):
    """A stopped run covers every task type alike: a/1, b/1, a/2, b/2, a/3."""
    from agent_shell.parallel import round_robin_by_type

    type_of = lambda t: t.split("/")[0]  # noqa: E731
    assert round_robin_by_type(TASKS, type_of) == ["a/1", "b/1", "a/2", "b/2", "a/3"]
    assert round_robin_by_type([], type_of) == []
    out = tmp_path / "results.jsonl"
    run_parallel(make_players, ["react"], TASKS, out, BUDGET, workers=1, meta={"seed": 0}, task_type_of=type_of)
    assert [r["task_id"] for r in read_results(out)] == ["a/1", "b/1", "a/2", "b/2", "a/3"]


def test_without_ray_a_parallel_run_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)
    from agent_shell.parallel import start_ray

    with pytest.raises(ModuleNotFoundError, match=r"pip install 'cb-agent\[ray\]'.*--workers 1"):
        start_ray(2)
