"""The scheduler's Ray executor on a local Ray cluster: the same records as the in-process executor
(faults, retries and error records included), a killed worker's episode retried, a repeatedly
failing one stored as an error record, nothing lost or duplicated."""

from __future__ import annotations

import functools
import re
import sys

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'cb-agent[ray]')")

from agent_shell.parallel import RayExecutor  # noqa: E402
from agent_shell.results import read_results  # noqa: E402
from agent_shell.scheduler import InProcessExecutor, play_episodes, schedule  # noqa: E402
from parallel_doubles import AGENTS, make_players, players_built_together  # noqa: E402
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


def on_ray(players, agents, tasks, out, workers=2, **kw):
    return play_episodes(RayExecutor(players, workers), agents, tasks, out, BUDGET, meta={"seed": 0}, **kw)


def in_process(players, agents, tasks, out, **kw):
    return play_episodes(InProcessExecutor(*players()), agents, tasks, out, BUDGET, meta={"seed": 0}, **kw)


@pytest.fixture(scope="module")
def sequential(tmp_path_factory):
    out = tmp_path_factory.mktemp("seq") / "results.jsonl"
    in_process(make_players, AGENTS, TASKS, out)
    return by_episode(read_results(out))


def test_parallel_records_equal_the_sequential_ones(cluster, sequential, tmp_path):
    out = tmp_path / "results.jsonl"
    lines = []
    summaries = on_ray(make_players, AGENTS, TASKS, out, echo=lines.append)
    assert by_episode(read_results(out)) == sequential
    assert len(sequential) == 10 and any(r["success"] for r in sequential.values())
    assert {n: len(s.records) for n, s in summaries.items()} == {"react": 5, "prior-only": 5}
    assert len(lines) == 10 and all(" steps=" in line for line in lines)
    assert not (tmp_path / "results.jsonl.partial").exists()  # the workers' partial states removed
    # resume: nothing left to do, nothing duplicated
    again = on_ray(make_players, AGENTS, TASKS, out, resume=True)
    assert all(s.records == [] and len(s.skipped) == 5 for s in again.values())
    assert len(read_results(out)) == 10


@pytest.mark.slow  # two executors' runs side by side on Ray
def test_one_worker_in_process_and_two_ray_workers_give_the_same_records(cluster, sequential, tmp_path):
    """The same jobs (an engine fault, an episode failing every attempt, task types) through both
    executors: the same records apart from timings, the same lines apart from s/step; in process the
    file follows the schedule, on Ray the order episodes finished in."""
    type_of = lambda t: {"a": "fetch", "b": "open"}[t[0]]  # noqa: E731
    players = functools.partial(make_players, raise_on=("a/3",), fail_on=("b/2",))
    got, lines = {}, {}
    for name, run in (("in-process", in_process), ("ray", on_ray)):
        out = tmp_path / name / "results.jsonl"
        lines[name] = []
        run(players, AGENTS, TASKS, out, task_type_of=type_of, max_attempts=2, echo=lines[name].append)
        got[name] = [(r["agent"], r["task_id"], untimed(r)) for r in read_results(out)]
        assert not (tmp_path / name / "results.jsonl.partial").exists()
    order = schedule(AGENTS, TASKS, type_of)
    assert order[:4] == [("react", "a/1"), ("prior-only", "a/1"), ("react", "b/1"), ("prior-only", "b/1")]
    assert [(a, t) for a, t, _ in got["in-process"]] == order
    assert sorted(got["ray"], key=lambda x: order.index(x[:2])) == got["in-process"]
    records = {(a, t): r for a, t, r in got["in-process"]}
    for key, record in records.items():  # the faults as planned, every other episode as without them
        if key[1] not in ("a/3", "b/2"):
            assert record == sequential[key]
    assert records[("react", "a/3")]["error"]["type"] == "EngineError"
    failed = records[("react", "b/2")]["error"]
    assert failed["attempts"] == 2 and failed["reasons"] == ["RuntimeError: the LM failed on b/2"] * 2
    untimed_lines = {name: sorted(re.sub(r"s/step=\S+", "", line) for line in lines[name]) for name in lines}
    assert untimed_lines["ray"] == untimed_lines["in-process"]
    assert "react b/2 retried (attempt 2/2): RuntimeError: the LM failed on b/2" in lines["ray"]


@pytest.mark.slow  # a time limit run out in both executors
def test_an_episode_past_its_time_limit_becomes_an_error_record_in_either_executor(cluster, sequential, tmp_path):
    """An engine step that never returns: the episode ends at the limit as an error record with
    the steps played before it (no retry), and the run goes on to the next episode. The limit is
    far above what a scripted episode takes and the hang is endless, so no timing decides it."""
    players = functools.partial(make_players, hang_on=("a/2",))
    got = {}
    for name, run in (("in-process", in_process), ("ray", on_ray)):
        out = tmp_path / name / "results.jsonl"
        lines = []
        run(players, ["react"], ["a/2", "a/3"], out, echo=lines.append, time_limit=1.0)
        got[name] = by_episode(read_results(out))
        assert not any("retried" in line for line in lines), (name, lines)
    assert got["ray"] == got["in-process"]
    hung = got["in-process"][("react", "a/2")]
    assert hung["success"] is False and hung["error"]["type"] == "EpisodeTimeout"
    assert hung["error"]["message"] == "episode ran past its wall-clock limit of 1 s"
    assert "attempts" not in hung["error"] and hung["steps"] == 2 and hung["error"]["step"] == 3  # think, go, (open)
    assert got["in-process"][("react", "a/3")] == sequential[("react", "a/3")]  # the run went on


@pytest.mark.slow  # Ray workers each setting up their players
def test_the_workers_of_a_run_build_their_players_together(cluster, sequential, tmp_path):
    """Each worker's players are built only once both workers have begun building theirs: workers
    that built one after another (each waited for before the next starts) would never finish."""
    out = tmp_path / "results.jsonl"
    on_ray(functools.partial(players_built_together, 2, str(tmp_path)), AGENTS, TASKS, out)
    assert len(list(tmp_path.glob("building-*"))) == 2
    assert by_episode(read_results(out)) == sequential


@pytest.mark.slow  # a Ray worker killed and replaced
def test_a_killed_worker_s_episode_is_retried_without_loss_or_duplication(cluster, sequential, tmp_path):
    out = tmp_path / "results.jsonl"
    players = functools.partial(make_players, kill_on=("a/2",), kills=1, marker_dir=str(tmp_path))
    lines = []
    on_ray(players, AGENTS, TASKS, out, echo=lines.append)
    assert (tmp_path / "a_2").read_text() == "xxx"  # killed once, then played by react and prior-only
    assert by_episode(read_results(out)) == sequential
    (retried,) = [line for line in lines if "retried" in line]
    head = "react a/2 retried (attempt 2/3): worker died: "
    assert retried.startswith(head)
    # the reason is Ray's error for a dead actor (its class name, then its message)
    error, _, message = retried[len(head):].partition(": ")
    assert error in subclass_names(ray.exceptions.RayActorError) and message, retried


def subclass_names(cls: type) -> set[str]:
    """The names of ``cls`` and of all its subclasses."""
    return {cls.__name__}.union(*(subclass_names(sub) for sub in cls.__subclasses__()))


@pytest.mark.slow  # three attempts of an episode on Ray workers
def test_a_repeatedly_failing_episode_becomes_an_error_record(cluster, sequential, tmp_path):
    out = tmp_path / "results.jsonl"
    players = functools.partial(make_players, kill_on=("b/1",), kills=99, raise_on=("a/3",),
                                marker_dir=str(tmp_path))
    on_ray(players, ["react"], TASKS, out, max_attempts=2, task_type_of=lambda t: {"a": "fetch", "b": "open"}[t[0]])
    got = by_episode(read_results(out))
    assert sorted(got) == sorted(("react", t) for t in TASKS)
    for task in ("a/1", "a/2", "b/2"):
        assert got[("react", task)] == sequential[("react", task)]
    crashed, killed = got[("react", "a/3")], got[("react", "b/1")]
    # an engine fault ends its episode at once, in either executor (no retry)
    assert crashed["success"] is False and crashed["steps"] == 0 and crashed["task_type"] == "fetch"
    assert crashed["error"]["type"] == "EngineError" and "attempts" not in crashed["error"]
    assert crashed["error"]["message"].endswith("RuntimeError: engine crashed on a/3")
    alone = tmp_path / "sequential.jsonl"
    in_process(players, ["react"], ["a/3"], alone)
    assert by_episode(read_results(alone))[("react", "a/3")] == crashed
    # a worker that dies on every attempt: an error record after max_attempts
    assert killed["success"] is False and killed["steps"] == 0 and killed["task_type"] == "open"
    assert killed["error"]["attempts"] == 2 and all(r.startswith("worker died") for r in killed["error"]["reasons"])
    assert killed["error"]["type"] and killed["error"]["message"] == killed["error"]["reasons"][-1]
    # with --keep-errors the error records count as finished: a resumed run duplicates nothing
    again = on_ray(players, ["react"], TASKS, out, resume=True, keep_errors=True)
    assert again["react"].records == [] and len(read_results(out)) == 5


@pytest.mark.slow  # a Ray worker's backbone fault
def test_a_fault_of_the_backbone_on_a_worker_stops_the_run(cluster, tmp_path):
    """A worker's backbone that cannot run (:class:`agent_shell.lm.protocol.BackboneFault`) stops
    the run with the fault itself, as in process: no retry, no error record."""
    from agent_shell.lm.protocol import BackboneFault

    out = tmp_path / "results.jsonl"
    lines: list[str] = []
    with pytest.raises(BackboneFault, match="stream pass cannot run"):
        on_ray(functools.partial(make_players, broken_on=("a/2",)), ["react"], TASKS, out, echo=lines.append)
    assert not any("retried" in line or "FAILED" in line for line in lines), lines
    assert all("error" not in r for r in read_results(out))


class RecordingRayExecutor(RayExecutor):
    """The Ray executor, noting the episodes in the order the driver hands them to the workers."""

    def __init__(self, *args, started: list, **kwargs):
        super().__init__(*args, **kwargs)
        self.noted = started

    def submit(self, job):
        self.noted.append((job.agent, job.task_id))
        super().submit(job)


@pytest.mark.slow  # a whole run on Ray workers
def test_episodes_start_game_by_game(cluster, sequential, tmp_path):
    """With two workers, every agent starts a game before the next game starts (the order the driver
    hands episodes out), so a run stopped part-way is a paired comparison; a resumed run keeps it."""
    out, started = tmp_path / "results.jsonl", []
    for agents, tasks, resume in ((["react"], TASKS[:1], False), (AGENTS, TASKS[:3], True)):
        play_episodes(RecordingRayExecutor(make_players, 2, started=started), agents, tasks, out, BUDGET,
                      meta={"seed": 0}, resume=resume)
    assert started == [("react", "a/1"), ("prior-only", "a/1"), ("react", "a/2"), ("prior-only", "a/2"),
                       ("react", "a/3"), ("prior-only", "a/3")]
    assert by_episode(read_results(out)) == {k: sequential[k] for k in started}


def test_with_task_types_games_start_round_robin_over_the_types(cluster, sequential, tmp_path):
    """A stopped run covers every task type alike: a/1, b/1, a/2, b/2, a/3."""
    from agent_shell.scheduler import round_robin_by_type

    type_of = lambda t: t.split("/")[0]  # noqa: E731
    assert round_robin_by_type(TASKS, type_of) == ["a/1", "b/1", "a/2", "b/2", "a/3"]
    assert round_robin_by_type([], type_of) == []
    out = tmp_path / "results.jsonl"
    on_ray(make_players, ["react"], TASKS, out, workers=1, task_type_of=type_of)
    assert [r["task_id"] for r in read_results(out)] == ["a/1", "b/1", "a/2", "b/2", "a/3"]


def test_without_ray_a_parallel_run_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)
    from agent_shell.parallel import start_ray

    with pytest.raises(ModuleNotFoundError, match=r"pip install 'cb-agent\[ray\]'.*--workers 1"):
        start_ray(2)


def test_an_episode_out_of_memory_on_a_worker_is_its_error_record_as_in_process(cluster, sequential, tmp_path):
    """A worker's pass out of memory (PyTorch's CPU out-of-memory, a plain RuntimeError, the one
    that stopped runs: the other libraries' errors take the same path, tested in process) ends that
    episode as the error record the in-process executor stores, at its first attempt, and the
    other episodes run as they do without the fault."""
    from parallel_doubles import ASKED

    players = functools.partial(make_players, oom_on=("a/2",))
    got = {}
    for name, run in (("in-process", in_process), ("ray", on_ray)):
        out = tmp_path / f"{name}.jsonl"
        lines: list[str] = []
        run(players, ["react"], TASKS, out, echo=lines.append)
        got[name] = by_episode(read_results(out))
        assert not any("retried" in line or "FAILED" in line for line in lines), lines
    assert got["ray"] == got["in-process"]
    error = got["ray"].pop(("react", "a/2"))["error"]
    assert error["type"] == "PassOutOfMemory" and error["bytes_asked"] == ASKED["torch-cpu"]
    assert got["ray"] == {key: r for key, r in sequential.items() if key in got["ray"]}
