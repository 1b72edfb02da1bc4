"""`cb-agent improve` end to end with doubles: rounds of play on training games, the won episodes'
decisions added to the concept data, warm-started refits, the evaluation per round, resume after a
kill, the guard against evaluating on training games, a round without a win."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import agent_shell.lm
import envs
from agent_doubles import FakeLM, SplitEnv
from agent_shell.cli import main
from agent_shell.results import read_results

#: task id -> (type, solution): the expert wins every game; the agent's prior prefers the actions
#: that name a desk (FakeLM(prefer="desk")), so it wins some games and loses others
GAMES = {
    **{f"fetch/train/{i}": ("fetch", ["go desk", f"take key{i} desk"]) for i in range(1, 7)},
    **{f"fetch/test/{i}": ("fetch", ["go desk", f"take key{i} desk"]) for i in (7, 8)},
    "fetch/test/9": ("fetch", ["go shelf", "take book9 shelf"]),
    **{f"open/train/{i}": ("open", ["go desk", f"open drawer{i}", "go hall"]) for i in range(1, 7)},
    **{f"open/test/{i}": ("open", ["go desk", f"open drawer{i}", "go hall"]) for i in (7, 8)},
}


@pytest.fixture()
def doubles(monkeypatch, tmp_path):
    """make_env -> SplitEnv, load_language_model -> FakeLM(prefer=...) (``doubles["prefer"]``)."""
    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path / "cache"))
    state = {"prefer": "desk", "lms": [], "envs": []}

    def load(name=None, dtype="float32", **_):
        state["lms"].append(FakeLM((" go",), prefer=state["prefer"]))
        return state["lms"][-1]

    def make(name, **kw):
        state["envs"].append(SplitEnv(GAMES))
        return state["envs"][-1]

    monkeypatch.setattr(envs, "make_env", make)
    monkeypatch.setattr(agent_shell.lm, "load_language_model", load)
    return state


def improve_args(out, *more):
    return ["improve", "--env", "textworld", "--split", "test", "--per-type", "0", "--games", "0", "--max-steps", "6",
            "--demos-per-type", "1", "--rounds", "2", "--games-per-round", "2", "--out-dir", str(out), *more]


def saved_concepts(out):
    """Every round's concepts as (alpha's bytes, metadata) by file, and provenance.json's text
    (a concept file's header order is the safetensors writer's, not part of the comparison)."""
    import cb_core

    saved = {}
    for p in sorted(out.glob("round-*/concepts/*")):
        if p.suffix == ".safetensors":
            c = cb_core.Concept.load(p)
            saved[p.relative_to(out).as_posix()] = (c.alpha.tobytes(), json.dumps(c.metadata, sort_keys=True))
        else:
            saved[p.relative_to(out).as_posix()] = p.read_text()
    return saved


def played_with(concepts, out, max_steps):
    """The records of ``cb-agent run --concepts CONCEPTS`` on every test game (a fresh run)."""
    res = CliRunner().invoke(main, ["run", "--env", "textworld", "--split", "test", "--per-type", "0", "--games", "0",
                                    "--max-steps", str(max_steps), "--demos-per-type", "1", "--agent", "cb-agent",
                                    "--concepts", str(concepts), "--out-dir", str(out)])
    assert res.exit_code == 0, res.output
    return [r for p in out.glob("*.jsonl") for r in read_results(p)]


def actions_by_game(records):
    """task id -> the actions of its episode (every trial's steps in order)."""
    return {r["task_id"]: [s["action"] for t in r["trials"] for s in t["trajectory"]["steps"]] for r in records}


def episodes(out):
    """(file, agent, task, won, actions) of every episode record under ``out``."""
    rows = []
    for path in sorted(out.glob("round-*/*.jsonl")):
        for r in read_results(path):
            actions = [s["action"] for t in r["trials"] for s in t["trajectory"]["steps"]]
            rows.append((path.relative_to(out).as_posix(), r["agent"], r["task_id"], r["success"], actions))
    return rows


def test_the_loop_adds_won_training_episodes_to_the_concept_data_and_evaluates_each_round(tmp_path, doubles):
    import cb_core

    out = tmp_path / "imp"
    res = CliRunner().invoke(main, improve_args(out))
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in lines] == [0, 1, 2]
    # round k plays the k-th slice of 2 training games per type that the expert data (game 1 of
    # each type: --demos-per-type 1) did not use
    assert lines[1]["train_games"] == ["fetch/train/2", "open/train/2", "fetch/train/3", "open/train/3"]
    assert lines[2]["train_games"] == ["fetch/train/4", "open/train/4", "fetch/train/5", "open/train/5"]
    for line in lines[1:]:
        records = read_results(out / f"round-{line['round']}" / "train.jsonl")
        assert sorted(r["task_id"] for r in records) == sorted(line["train_games"])
        won = sorted(r["task_id"] for r in records if r["success"])
        assert won and sorted(line["won_games"]) == won
        # every environment step of a won game is a new decision (no look/inventory/help to filter here)
        assert sum(line["new_decisions"].values()) == sum(r["env_steps"] for r in records if r["success"])
        assert line["in_expert_states"] + line["new_states"] == sum(line["new_decisions"].values())
        assert all(r["concept_round"] == line["round"] - 1 and r["split"] == "train" for r in records)
    # the provenance of round 2's concepts: the expert game and the own won games of rounds 1 and 2
    prov = json.loads((out / "round-2" / "concepts" / "provenance.json").read_text())
    assert prov["round"] == 2 and prov["warm_start"] == 1
    fetch_won = [t for line in lines[1:] for t in line["won_games"] if t.startswith("fetch")]
    assert prov["types"]["fetch"]["expert"] == ["fetch/train/1"] and prov["types"]["fetch"]["own"] == fetch_won
    meta = cb_core.Concept.load(out / "round-2" / "concepts" / "fetch.safetensors").metadata
    assert meta["provenance"]["own"] == fetch_won and meta["provenance"]["round"] == 2
    own_steps = sum(r["env_steps"] for k in (1, 2) for r in read_results(out / f"round-{k}" / "train.jsonl")
                    if r["success"] and r["task_type"] == "fetch")
    assert meta["fit"]["warm_start"] and meta["n_decisions"] == 2 + own_steps
    # each round evaluated on every test game, recorded with its round
    for k in range(3):
        evals = read_results(out / f"round-{k}" / "results.jsonl")
        assert sorted(r["task_id"] for r in evals) == sorted(t for t in GAMES if "/test/" in t)
        assert {r["concept_round"] for r in evals} == {k}
        assert lines[k]["eval"] == {"won": sum(r["success"] for r in evals), "n": 5, "errors": 0}
    text = " ".join(res.output.split())
    assert "round 1/2: cb-agent with round 0's concepts on 4 training games of train" in text
    assert text.count("cb-agent fetch/test/7") == 3  # one line per game and round
    assert "round 2: evaluation" in text and "paired against round 0" in text
    assert (out / "rounds.png").exists()
    # `run --concepts` plays with a chosen round's concepts and records which round
    res = CliRunner().invoke(main, ["run", "--env", "textworld", "--split", "test", "--agent", "cb-agent", "--game",
                                    "fetch/test/9", "--max-steps", "4", "--demos-per-type", "1", "--concepts",
                                    str(out / "round-2" / "concepts"), "--out-dir", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    (rec,) = read_results(tmp_path / "run" / "results.jsonl")
    assert rec["concept_round"] == 2 and rec["concepts_dir"] == str(out / "round-2" / "concepts")
    same = read_results(out / "round-2" / "results.jsonl")
    assert [s["action"] for s in rec["trials"][0]["trajectory"]["steps"]] == next(
        [s["action"] for s in r["trials"][0]["trajectory"]["steps"]] for r in same if r["task_id"] == "fetch/test/9")


class Killed(BaseException):
    """A simulated kill -9: nothing after it runs (no except clause of the code catches it)."""


@pytest.mark.parametrize("where", ["train-episode", "fit", "eval-episode", "round-line"])
def test_resume_after_a_kill_gives_what_an_uninterrupted_run_gives(tmp_path, doubles, monkeypatch, where):
    import agent_shell.improve as improve_module
    import cb_core

    whole = tmp_path / "whole"
    assert CliRunner().invoke(main, improve_args(whole)).exit_code == 0
    out = tmp_path / "killed"
    calls = {"n": 0}

    def kill_on(target, name, nth):
        original = getattr(target, name)

        def wrapped(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == nth:
                raise Killed()
            return original(*args, **kwargs)

        monkeypatch.setattr(target, name, wrapped)

    steps = {f: sum(r["env_steps"] for r in read_results(whole / f)) for f in
             ("round-0/results.jsonl", "round-1/train.jsonl", "round-1/results.jsonl")}
    if where == "train-episode":  # the 2nd step of round 1's 3rd training game
        first_two = sum(r["env_steps"] for r in read_results(whole / "round-1" / "train.jsonl")[:2])
        kill_on(SplitEnv, "step", steps["round-0/results.jsonl"] + first_two + 2)
    elif where == "fit":  # round 1's refit of its second type (round 0's concepts come from the cache)
        kill_on(cb_core, "fit", 2)
    elif where == "eval-episode":  # the 3rd step of round 1's evaluation
        kill_on(SplitEnv, "step", steps["round-0/results.jsonl"] + steps["round-1/train.jsonl"] + 3)
    else:
        kill_on(improve_module.ResumableJsonl, "append", 2)  # round 1's line, after its evaluation
    with pytest.raises(Killed):
        CliRunner().invoke(main, improve_args(out))
    monkeypatch.undo()
    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(envs, "make_env", lambda name, **kw: SplitEnv(GAMES))
    monkeypatch.setattr(agent_shell.lm, "load_language_model", lambda name=None, dtype="float32", **_: FakeLM(
        (" go",), prefer="desk"))
    refused = CliRunner().invoke(main, improve_args(out))
    assert refused.exit_code == 1 and "--resume" in refused.output
    res = CliRunner().invoke(main, improve_args(out, "--resume"))
    assert res.exit_code == 0, res.output
    assert saved_concepts(out) == saved_concepts(whole) and len(saved_concepts(out)) == 3 * 3
    assert episodes(out) == episodes(whole)  # nothing lost, no game played twice, the same play
    strip = lambda line: {k: v for k, v in line.items() if k != "concepts"}  # noqa: E731
    assert [strip(json.loads(x)) for x in (out / "rounds.jsonl").read_text().splitlines()] == [
        strip(json.loads(x)) for x in (whole / "rounds.jsonl").read_text().splitlines()]


def test_a_finished_run_resumed_plays_nothing_and_keeps_its_files(tmp_path, doubles):
    """Every round line (its played training games among its fields) agrees with the run's
    settings: resuming a finished run changes no file and prints the same rounds."""
    out = tmp_path / "imp"
    first = CliRunner().invoke(main, improve_args(out))
    assert first.exit_code == 0, first.output
    files = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.suffix != ".png"}
    again = CliRunner().invoke(main, improve_args(out, "--resume"))
    assert again.exit_code == 0, again.output
    assert {p: p.read_bytes() for p in files} == files
    assert "round 2: finished before (--resume)" in again.output


def test_a_full_disk_stops_improve_in_one_line_and_resume_finishes_the_rounds(tmp_path, doubles, monkeypatch):
    """An output improve cannot write (ENOSPC on a round's episode state) stops the rounds with one
    line naming the file and the free space, no traceback and no retry; --resume then finishes the
    round."""
    import errno

    import cb_io.storage

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    out = tmp_path / "imp"
    with monkeypatch.context() as m:
        m.setattr(cb_io.storage.tempfile, "mkstemp", full)
        res = CliRunner().invoke(main, improve_args(out, "--rounds", "1"))
    assert res.exit_code == 1, (res.output, res.exception)
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("Error:")]
    assert "cannot write" in line and "No space left on device" in line and "bytes free" in line
    assert "retried" not in res.output and "Traceback" not in res.output
    resumed = CliRunner().invoke(main, improve_args(out, "--rounds", "1", "--resume"))
    assert resumed.exit_code == 0, resumed.output
    assert "round 1:" in resumed.output and (out / "round-1" / "results.jsonl").is_file()


def test_evaluation_games_that_are_training_games_are_refused_in_one_line(tmp_path, doubles):
    res = CliRunner().invoke(main, ["improve", "--env", "textworld", "--split", "train", "--game", "fetch/train/3",
                                    "--out-dir", str(tmp_path / "imp")])
    assert res.exit_code == 1
    assert "Error: evaluation game 'fetch/train/3' is also a training game" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not doubles["lms"]  # before the backbone loads
    named = CliRunner().invoke(main, improve_args(tmp_path / "imp2", "--train-game", "fetch/test/7"))
    assert named.exit_code == 1 and "fetch/test/7" in named.output and not doubles["lms"]


def test_a_round_without_a_win_keeps_the_last_concepts_and_says_so(tmp_path, doubles):
    import cb_core

    out = tmp_path / "imp"  # every game takes 2 steps or more: with a budget of 1 none is won
    res = CliRunner().invoke(main, improve_args(out, "--rounds", "1", "--max-steps", "1"))
    assert res.exit_code == 0, res.output
    assert "no won training game: round 0's concepts are kept" in " ".join(res.output.split())
    line = json.loads((out / "rounds.jsonl").read_text().splitlines()[1])
    assert line["won_games"] == [] and line["kept_last"] and line["new_decisions"] == {}
    for t in ("fetch", "open"):
        before = cb_core.Concept.load(out / "round-0" / "concepts" / f"{t}.safetensors")
        after = cb_core.Concept.load(out / "round-1" / "concepts" / f"{t}.safetensors")
        assert np.array_equal(before.alpha, after.alpha)
    assert json.loads((out / "round-1" / "concepts" / "provenance.json").read_text())["kept_last"]
    # the same concepts: round 0's evaluation episodes stand for round 1's, not played again ...
    assert "round 1: the concepts of fetch, open are round 0's: its 5 evaluation episodes" in " ".join(res.output.split())
    rounds = {k: [(r["task_id"], r["success"], r["trials"]) for r in read_results(out / f"round-{k}" / "results.jsonl")]
              for k in (0, 1)}
    assert rounds[1] == rounds[0] and len(rounds[0]) == 5
    assert {r["evaluated_as_round"] for r in read_results(out / "round-1" / "results.jsonl")} == {0}
    # ... and playing round 1's concepts anew gives those episodes, action for action
    played = played_with(out / "round-1" / "concepts", tmp_path / "replay", max_steps=1)
    assert actions_by_game(played) == actions_by_game(read_results(out / "round-1" / "results.jsonl"))


def test_a_type_without_a_win_keeps_its_evaluation_episodes_and_the_refitted_type_plays_again(tmp_path, doubles):
    """Budget 2: the fetch games (two steps) are won, the open games (three) cannot be. Round 1
    refits fetch only: its fetch games are played again, its open games are round 0's episodes;
    a fresh run with round 1's concepts plays every game action for action as recorded."""
    out = tmp_path / "imp"
    res = CliRunner().invoke(main, improve_args(out, "--rounds", "1", "--max-steps", "2"))
    assert res.exit_code == 0, res.output
    provenance = json.loads((out / "round-1" / "concepts" / "provenance.json").read_text())["types"]
    assert provenance["fetch"]["refitted"] and not provenance["open"]["refitted"]
    assert "round 1: the concepts of open are round 0's: its 2 evaluation episodes" in " ".join(res.output.split())
    round1 = read_results(out / "round-1" / "results.jsonl")
    assert {r["task_id"]: r.get("evaluated_as_round") for r in round1} == {
        "fetch/test/7": None, "fetch/test/8": None, "fetch/test/9": None, "open/test/7": 0, "open/test/8": 0}
    played = played_with(out / "round-1" / "concepts", tmp_path / "replay", max_steps=2)
    assert len(played) == 5 and actions_by_game(played) == actions_by_game(round1)


def test_each_refit_starts_at_the_last_rounds_concept(tmp_path, doubles, monkeypatch):
    import cb_core

    starts = []
    fit = cb_core.fit

    def recording(decisions, *args, init=None, **kwargs):
        starts.append(None if init is None else np.array(init))
        return fit(decisions, *args, init=init, **kwargs)

    monkeypatch.setattr(cb_core, "fit", recording)
    out = tmp_path / "imp"
    assert CliRunner().invoke(main, improve_args(out, "--rounds", "1")).exit_code == 0
    round0 = [cb_core.Concept.load(out / "round-0" / "concepts" / f"{t}.safetensors").alpha for t in ("fetch", "open")]
    assert starts[0] is None and starts[1] is None  # round 0: cold fits of the expert data
    assert len(starts) == 4 and all(np.array_equal(s, a) for s, a in zip(starts[2:], round0))


@pytest.mark.slow  # float64 fits from many starts
def test_a_fit_started_anywhere_reaches_the_same_optimum_and_starts_where_told():
    import cb_core

    rng = np.random.default_rng(0)
    sizes = [4] * 30
    dec = cb_core.decisions_from_lists([rng.normal(size=(m, 6)) for m in sizes], [-rng.gamma(2, 1, m) for m in sizes],
                                       [np.ones(m, int) for m in sizes], [int(rng.integers(m)) for m in sizes])
    start = rng.normal(size=7).astype(np.float32)
    for solver in (cb_core.Newton(), cb_core.Subspace()):
        cold = cb_core.fit(dec, solver, lam=0.5)
        warm = cb_core.fit(dec, solver, lam=0.5, init=start)
        assert warm.settings["warm_start"] and not cold.settings["warm_start"]
        assert warm.converged and abs(warm.loss - cold.loss) < 1e-5
        assert np.allclose(warm.alpha, cold.alpha, atol=2e-3)
    stay = cb_core.fit(dec, cb_core.Newton(max_iter=0), lam=0.5, init=start)
    assert np.array_equal(stay.alpha, start)  # no step taken: the first iterate is the start
    with pytest.raises(ValueError, match=r"init must be alpha \[d \+ 1\] = \[7\]"):
        cb_core.fit(dec, lam=0.5, init=start[:3])


# -- relabelled rounds: the expert labels the agent's own states (--labels expert) ----------------

class LabellingEnv(SplitEnv):
    """:class:`SplitEnv` whose expert answers from any state (the next action of the solution
    after the agent's correct steps so far), except where a real expert fails: it answers nothing
    in open/train/3 once a step is made, and an action outside the candidate set in the second
    state of fetch/train/3."""

    expert_labels_any_state = True

    def expert_action(self):
        if self._task == "open/train/3" and self._pos >= 1:
            return None
        if self._task == "fetch/train/3" and self._pos == 1:
            return "dance on the desk"
        return super().expert_action()


def expected_labels(task_id, actions):
    """The expert's label in each state of an episode that took ``actions``, computed from the
    games' rule (not the code's): (label, None) or (None, why)."""
    solution, pos, out = GAMES[task_id][1], 0, []
    for action in actions:
        if task_id == "open/train/3" and pos >= 1:
            out.append((None, "no answer"))
        elif task_id == "fetch/train/3" and pos == 1:
            out.append((None, "not a candidate"))
        else:
            out.append((solution[pos], None) if pos < len(solution) else (None, "no answer"))
        if pos < len(solution) and action == solution[pos]:
            pos += 1
    return out


@pytest.fixture()
def labelling(doubles, monkeypatch):
    monkeypatch.setattr(envs, "make_env", lambda name, **kw: LabellingEnv(GAMES))
    return doubles


@pytest.mark.slow
def test_expert_labels_every_state_of_won_and_lost_episodes_and_counts_the_unlabelled(tmp_path, labelling):
    import cb_core
    from agent_shell.concepts import decision_inputs
    from agent_shell.configure import feature_settings, resolve
    from agent_shell.improve_labels import expert_targets
    from agent_shell.run_config import RunConfig

    out = tmp_path / "imp"
    res = CliRunner().invoke(main, improve_args(out, "--labels", "expert"))
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert [line["labels"] for line in lines] == ["expert"] * 3
    off_path, from_lost, from_won = 0, 0, 0
    for line in lines[1:]:
        k = line["round"]
        train = read_results(out / f"round-{k}" / "train.jsonl")
        labelled = {r["task_id"]: r for r in read_results(out / f"round-{k}" / "labelled.jsonl")}
        assert sorted(labelled) == sorted(line["train_games"])
        seen, decisions, unlabelled, agreed, n_labelled = set(), {}, {}, {}, {}
        for game in line["train_games"]:  # the round's order: the first visit of a state is kept
            r = next(r for r in train if r["task_id"] == game)
            t = GAMES[game][0]
            for trial, relabelled in zip(r["trials"], labelled[game]["trials"]):
                steps = trial["trajectory"]["steps"]
                want = expected_labels(game, [s["action"] for s in steps])
                got = [(s["info"].get("expert_action"), s["info"].get("expert_unlabelled"))
                       for s in relabelled["trajectory"]["steps"]]
                assert got == want and [s["action"] for s in relabelled["trajectory"]["steps"]] == [
                    s["action"] for s in steps]  # the agent's actions stay: the label is beside them
                last = trial["trajectory"]["observation"]
                for s, (label, why) in zip(steps, want):
                    if label is None:
                        unlabelled.setdefault(t, {}).setdefault(why, 0)
                        unlabelled[t][why] += 1
                    else:
                        n_labelled[t] = n_labelled.get(t, 0) + 1
                        agreed[t] = agreed.get(t, 0) + (label == s["action"])
                        off_path += label != s["action"]
                        key = (last.strip(), tuple(sorted(s["candidates"])), label)
                        if key in seen:
                            unlabelled.setdefault(t, {}).setdefault("repeated state", 0)
                            unlabelled[t]["repeated state"] += 1
                        else:
                            decisions[t] = decisions.get(t, 0) + 1
                            from_won += bool(r["success"])
                            from_lost += not r["success"]
                        seen.add(key)
                    last = s["observation"]
        assert line["new_decisions"] == decisions
        for t, c in line["types"].items():
            assert c["unlabelled"] == dict(sorted(unlabelled.get(t, {}).items()))
            assert (c["agreed"], c["labelled"]) == (agreed.get(t, 0), n_labelled.get(t, 0))
            assert c["won"] == sum(r["success"] for r in train if GAMES[r["task_id"]][0] == t)
    # won and lost games both contribute, and states off the expert's path are labelled
    assert from_won > 0 and from_lost > 0 and off_path > 0, (from_won, from_lost, off_path)
    assert {"no answer", "not a candidate", "repeated state"} <= {
        why for line in lines[1:] for c in line["types"].values() for why in c["unlabelled"]}
    # the targets of the relabelled decisions are the expert's labels, in the agent's states
    config = resolve(RunConfig(env="textworld", split="test"))
    settings = feature_settings(config)
    trajectories, _ = expert_targets(read_results(out / "round-1" / "labelled.jsonl"))
    n = 0
    for traj in trajectories:
        steps = [s for s in traj.steps if s.kind == "env"]
        for d, e in decision_inputs(traj, settings, relabelled=True)[0]:
            step = traj.steps[len(d.history)]
            assert d.candidates[e] == step.info["expert_action"] and [s.action for s in d.history] == [
                s.action for s in traj.steps[:len(d.history)]]
            n += 1
        assert len(steps) >= len(decision_inputs(traj, settings, relabelled=True)[0])
    assert n == sum(lines[1]["new_decisions"].values())
    # the aggregated data of round 2 is the union of the rounds: expert decisions + round 1's + round 2's
    for t in ("fetch", "open"):
        meta = cb_core.Concept.load(out / "round-2" / "concepts" / f"{t}.safetensors").metadata
        expert = len(GAMES[f"{t}/train/1"][1])
        assert meta["n_decisions"] == expert + lines[1]["new_decisions"][t] + lines[2]["new_decisions"][t]
    text = " ".join(res.output.split())
    assert "on-policy agreement" in text and "the expert labels the states of 4 training episodes" in text
    # `cb-agent report --rounds` shows the rounds and each round's play per type (agreement as counted above)
    evals = [str(p) for p in sorted(out.glob("round-*/results.jsonl"))]
    md = tmp_path / "report.md"
    shown = CliRunner().invoke(main, ["report", *evals, "--rounds", str(out / "rounds.jsonl"), "--markdown", str(md),
                                      "--chart", str(tmp_path / "report.png")])
    assert shown.exit_code == 0, shown.output
    c = lines[2]["types"]["open"]
    assert (f"| 2 | open | {c['won']}/{c['games']} | {c['decisions']} | {c['agreed']}/{c['labelled']} "
            f"({100 * c['agreed'] / c['labelled']:.1f}%) |") in md.read_text()
    # the decision explorer shows the expert's label beside the agent's action on a relabelled episode
    from agent_shell.view.data import episode_detail

    record = read_results(out / "round-1" / "labelled.jsonl")[0]
    detail = episode_detail(record)
    for step, s in zip(detail["trials"][0]["steps"], record["trials"][0]["trajectory"]["steps"]):
        label = s["info"].get("expert_action")
        assert (detail["strings"][step["e"]] if "e" in step else None) == label


def test_a_killed_relabelled_run_resumes_to_the_same_concepts(tmp_path, labelling, monkeypatch):
    import agent_shell.improve_labels as labels_module

    whole = tmp_path / "whole"
    assert CliRunner().invoke(main, improve_args(whole, "--labels", "expert")).exit_code == 0
    out = tmp_path / "killed"
    calls = {"n": 0}
    store = labels_module.store_record

    def killed_on_the_third_label(*args, **kwargs):  # round 1's third labelled episode
        calls["n"] += 1
        if calls["n"] == 3:
            raise Killed()
        return store(*args, **kwargs)

    monkeypatch.setattr(labels_module, "store_record", killed_on_the_third_label)
    with pytest.raises(Killed):
        CliRunner().invoke(main, improve_args(out, "--labels", "expert"))
    monkeypatch.setattr(labels_module, "store_record", store)
    assert len(read_results(out / "round-1" / "labelled.jsonl")) == 2
    res = CliRunner().invoke(main, improve_args(out, "--labels", "expert", "--resume"))
    assert res.exit_code == 0, res.output
    assert saved_concepts(out) == saved_concepts(whole) and len(saved_concepts(out)) == 3 * 3
    assert episodes(out) == episodes(whole)
    strip = lambda line: {k: v for k, v in line.items() if k != "concepts"}  # noqa: E731
    assert [strip(json.loads(x)) for x in (out / "rounds.jsonl").read_text().splitlines()] == [
        strip(json.loads(x)) for x in (whole / "rounds.jsonl").read_text().splitlines()]
    mixed = CliRunner().invoke(main, improve_args(out, "--resume"))  # --labels wins on an expert run: refused
    assert mixed.exit_code == 1 and "labels='expert'" in mixed.output


@pytest.mark.slow
def test_beta_mixes_the_experts_actions_into_training_play_at_beta_to_the_round(tmp_path, labelling):
    from envs.episode import AGENT_ACTION

    out = tmp_path / "imp"
    res = CliRunner().invoke(main, improve_args(out, "--labels", "expert", "--beta", "0.5"))
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert [line["expert_mix"] for line in lines] == [0.0, 0.5, 0.25] and {line["beta"] for line in lines} == {0.5}
    executed_in_all, per_round = 0, {}
    for line in lines[1:]:
        k = line["round"]
        train = read_results(out / f"round-{k}" / "train.jsonl")
        labelled = {r["task_id"]: r for r in read_results(out / f"round-{k}" / "labelled.jsonl")}
        executed, agreed, n_labelled = {}, {}, {}
        for r in train:
            assert r["expert_mix"] == 0.5 ** k
            t = GAMES[r["task_id"]][0]
            steps = [s for trial in r["trials"] for s in trial["trajectory"]["steps"]]
            # the expert's answer in each state the mixed play reached, from the games' rule
            want = expected_labels(r["task_id"], [s["action"] for s in steps])
            for s, (label, _) in zip(steps, want):
                if AGENT_ACTION in s["info"]:  # executed in the agent's place: the expert's answer there
                    assert s["action"] == label != s["info"][AGENT_ACTION]
                    executed[t] = executed.get(t, 0) + 1
                if label is not None:
                    n_labelled[t] = n_labelled.get(t, 0) + 1
                    agreed[t] = agreed.get(t, 0) + (label == s["info"].get(AGENT_ACTION, s["action"]))
            relabelled = [s for trial in labelled[r["task_id"]]["trials"] for s in trial["trajectory"]["steps"]]
            assert [s["action"] for s in relabelled] == [s["action"] for s in steps]  # replayed as executed
        for t, c in line["types"].items():
            assert (c["expert_executed"], c["agreed"], c["labelled"]) == (
                executed.get(t, 0), agreed.get(t, 0), n_labelled.get(t, 0))
        executed_in_all += sum(executed.values())
        per_round[k] = sum(executed.values())
    assert executed_in_all > 0
    # `cb-agent report --rounds` names each round's mix and the expert's steps it executed
    md = tmp_path / "report.md"
    shown = CliRunner().invoke(main, ["report", *map(str, sorted(out.glob("round-*/results.jsonl"))), "--rounds",
                                      str(out / "rounds.jsonl"), "--markdown", str(md), "--chart",
                                      str(tmp_path / "report.png")])
    assert shown.exit_code == 0, shown.output
    table = md.read_text()
    assert "| 0 | expert |" in table and "mix (--beta)" in table
    for k, mix in ((1, "0.5"), (2, "0.25")):
        steps = "step" if per_round[k] == 1 else "steps"
        assert f"| {k} | expert, mix {mix}: {per_round[k]} expert {steps} |" in table
    evaluated = [r for p in out.glob("round-*/results.jsonl") for r in read_results(p)]
    assert evaluated and not any(AGENT_ACTION in s["info"] for r in evaluated for t in r["trials"]
                                 for s in t["trajectory"]["steps"])  # evaluation plays the agent alone
    assert "the expert's action executed in" in " ".join(res.output.split())


def test_beta_without_expert_labels_is_refused_in_one_line(tmp_path, labelling):
    res = CliRunner().invoke(main, improve_args(tmp_path / "imp", "--beta", "0.5"))
    assert res.exit_code == 1 and not labelling["lms"] and not (tmp_path / "imp").exists()
    assert res.output.strip().splitlines() == [
        "Error: --beta 0.5: mixing in the expert's actions needs --labels expert (under --labels wins the targets "
        "are the agent's own choices)"]


def test_expert_labels_on_an_environment_whose_expert_cannot_label_are_refused_in_one_line(tmp_path, doubles):
    from envs.scienceworld import ScienceWorldEnv

    assert ScienceWorldEnv.expert_labels_any_state is False
    res = CliRunner().invoke(main, improve_args(tmp_path / "imp", "--labels", "expert"))  # SplitEnv: no such expert
    assert res.exit_code == 1 and not doubles["lms"] and not (tmp_path / "imp").exists()
    assert res.output.strip().splitlines() == [
        "Error: --labels expert: the scripted expert (scripted-expert) answers only along its own path and cannot "
        "label the agent's states; use --labels wins"]


def test_expert_answers_replays_an_episode_and_asks_the_expert_in_each_state():
    from dataclasses import replace

    from envs.collect import expert_answers
    from envs.episode import Episode

    env = LabellingEnv(GAMES)
    ep = Episode(env, "open/train/2", 6)
    for action in ("go to window 1", "go desk", "go desk", "open drawer2"):
        ep.act(action)
    traj = ep.trajectory()
    assert expert_answers(env, traj) == [("go desk", None), ("go desk", None), ("open drawer2", None),
                                         ("open drawer2", None)]
    steps = list(traj.steps)
    steps[1] = replace(steps[1], observation="You fly.")  # the engine would not answer so
    bent = replace(traj, steps=steps)
    assert expert_answers(env, bent) == [("go desk", None), ("go desk", None), (None, "replay differs"),
                                         (None, "replay differs")]


def test_a_loop_gives_one_decision_per_distinct_state_and_every_state_without_a_label_is_counted(tmp_path):
    """Labelled episodes as the expert leaves them (no LM, no loop run): a lost episode that
    alternates two states (its move counter differing on every step, as TextWorld's does) gives
    one decision per distinct state, the repeats and the states without a label counted by
    reason; a won episode's labels are targets too; the agreement counts the agent's choices."""
    from agent_shell.improve_labels import LABELS, round_labels

    def episode(task_id, won, steps):
        out, moves = [], 0
        for action, label, why, observation in steps:
            moves += 1
            info = {"expert_action": label} if label else {"expert_unlabelled": why}
            out.append({"kind": "env", "action": action, "observation": f"{observation}\n\n>  -= Shed =-0/{moves}",
                        "candidates": ["put key on rack", "take key from rack", "go south", "open chest"],
                        "done": False, "won": won and moves == len(steps), "score": 0.0, "info": info})
        trajectory = {"schema_version": 1, "env": "textworld", "task_id": task_id, "task_type": task_id.split("/")[0],
                      "instruction": "Open the chest.", "observation": "You are in a shed.", "steps": out,
                      "won": won, "score": float(won), "meta": {}}
        return {"schema": "cb-agent/episode-v1", "agent": "cb-agent", "task_id": task_id,
                "task_type": task_id.split("/")[0], "success": won, "trials": [{"won": won, "trajectory": trajectory}]}

    loop = [("put key on rack", "go south", None, "You put the key on the rack."),
            ("take key from rack", "go south", None, "You take the key."),
            ("put key on rack", "go south", None, "You put the key on the rack."),
            ("take key from rack", "go south", None, "You take the key."),
            ("put key on rack", None, "no answer", "You put the key on the rack.")]
    won = [("go south", "go south", None, "You go south."), ("open chest", "open chest", None, "Opened.")]
    lost_record, won_record = episode("custom-2/train/2", False, loop), episode("custom-1/train/2", True, won)
    out = tmp_path / "imp"
    (out / "round-1").mkdir(parents=True)
    for r in (lost_record, won_record):  # as label_round leaves them: read back, not labelled again
        with open(out / "round-1" / "labelled.jsonl", "a") as f:
            f.write(json.dumps(r) + "\n")
    games = ["custom-2/train/2", "custom-1/train/2"]
    source = round_labels("expert", object(), out, 1, [lost_record, won_record], games, print)
    assert LABELS == ("wins", "expert") and source.won_games == ["custom-1/train/2"]
    # the loop's states: after o0 (first visit), after "put" (first), after "take" (first), then a repeat
    # and a state without a label; the won game starts where the lost one did (same o0, candidates and
    # label): a repeat across the round's episodes too
    targets = {t.task_id: [s.info.get("expert_action") for s in t.steps] for t in source.targets}
    assert targets == {"custom-2/train/2": ["go south", "go south", "go south", None, None],
                       "custom-1/train/2": [None, "open chest"]}
    assert source.types["custom-2"] == {"games": 1, "won": 0, "decisions": 0, "labelled": 4, "agreed": 0,
                                        "expert_executed": 0, "unlabelled": {"no answer": 1, "repeated state": 1}}
    assert source.types["custom-1"] == {"games": 1, "won": 1, "decisions": 0, "labelled": 2, "agreed": 2,
                                        "expert_executed": 0, "unlabelled": {"repeated state": 1}}
    wins = round_labels("wins", None, out, 1, [lost_record, won_record], games, print)
    assert [t.task_id for t in wins.targets] == ["custom-1/train/2"] and wins.types["custom-2"]["labelled"] == 0
