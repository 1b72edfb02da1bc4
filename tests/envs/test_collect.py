"""Expert collection end to end on real ALFWorld train games: JSONL, resume, decision examples, CLI."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from agent_shell.candidates import drop_excluded
from agent_shell.expert_decisions import decision_examples
from cb_io.records import read_trajectories
from envs import make_env
from envs.alfworld import META_COMMANDS
from envs.collect import collect_expert_trajectories, select_tasks

SHORT_TRAIN_GAMES = [  # the handcoded expert wins each in 5 to 6 steps
    "pick_and_place_simple-AlarmClock-None-Desk-307/trial_T20190907_072303_146844",
    "look_at_obj_in_light-AlarmClock-None-DeskLamp-309/trial_T20190908_062755_880343",
]


@pytest.fixture(scope="module")
def env():
    e = make_env("alfworld")
    yield e
    e.close()


def test_collect_round_trip_resume_and_decisions(env, tmp_path):
    out = tmp_path / "alf.jsonl"
    first = collect_expert_trajectories(env, SHORT_TRAIN_GAMES[:1], out)
    assert first.collected == 1 and first.won == 1
    again = collect_expert_trajectories(env, SHORT_TRAIN_GAMES, out)  # resumes: plays only the new game
    assert again.skipped == SHORT_TRAIN_GAMES[:1] and again.collected == 1
    trajs = read_trajectories(out)
    assert [t.task_id for t in trajs] == SHORT_TRAIN_GAMES
    for traj in trajs:
        assert traj.won and traj.meta["expert"] == "alfworld-handcoded" and traj.meta["max_steps"] == 50
        env_steps = [s for s in traj.steps if s.kind == "env"]
        examples, skipped = decision_examples(traj)
        assert len(examples) == len(env_steps) and skipped == 0
        assert all(e.candidates[e.expert_index] == e.expert_action for e in examples)
        assert all(e.expert_action in traj.steps[e.step_index].candidates for e in examples)
        looks = sum(s.action in META_COMMANDS for s in env_steps)
        filtered, skipped = decision_examples(traj, drop_excluded)
        assert skipped == looks >= 1  # the expert's opening `look` is dropped with the filter
        assert len(filtered) == len(env_steps) - looks
    # every line on disk is one whole JSON record
    lines = out.read_bytes().splitlines()
    assert len(lines) == 2 and all(orjson.loads(line)["schema_version"] == 1 for line in lines)


def test_select_tasks_per_type(env):
    picked = select_tasks(env, "train", n_per_type=2)
    assert len(picked) == 12
    assert sorted({env.task_type_of(t) for t in picked}) == sorted(
        {env.task_type_of(t) for t in env.tasks("train")})


def test_cli_collect_and_resume(tmp_path):
    from agent_shell.cli import main

    out = tmp_path / "cli.jsonl"
    args = ["collect", "--env", "alfworld", "--split", "train", "--tasks", SHORT_TRAIN_GAMES[0], "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "collected 1 (won 1)" in result.output
    # not a terminal: one plain line per finished task
    assert f"expert {SHORT_TRAIN_GAMES[0]} won steps=" in result.output and " s/step=" in result.output
    whole = out.read_bytes()
    # without --resume (the default, as for run/probe/recover) the file is refused, never emptied
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 1 and "already holds 1 of these tasks" in again.output and out.read_bytes() == whole
    # a torn last line (an interrupted write): --resume moves it aside, the rest stays byte for byte
    with open(out, "ab") as fh:
        fh.write(b'{"schema_version": 1, "env": "alfw')
    result = CliRunner().invoke(main, [*args, "--resume"])
    assert result.exit_code == 0 and "collected 0" in result.output and "skipped 1" in result.output
    assert f"repaired {out}: line 2 (truncated line" in result.output and "Warning" not in result.output
    assert out.read_bytes() == whole and (tmp_path / "cli.jsonl.torn").read_bytes() == b'{"schema_version": 1, "env": "alfw\n'
    assert len(read_trajectories(out)) == 1 and read_trajectories(out)[0].meta["split"] == "train"
    bad = CliRunner().invoke(main, [*args, "--n-per-type", "1"])
    assert bad.exit_code != 0 and "mutually exclusive" in bad.output


@pytest.mark.parametrize("args, message", [
    (["--env", "alfworld", "--split", "train", "--tasks", "nosuch/x"],
     "Error: unknown ALFWorld task 'nosuch/x': no such game under "),
    (["--env", "alfworld", "--split", "train", "--tasks", "pick_and_place_simple-Foo-None-Bar-999/trial_X"],
     "Error: unknown ALFWorld task 'pick_and_place_simple-Foo-None-Bar-999/trial_X'"),
    (["--env", "alfworld", "--split", "train",  # a valid_unseen game collected as train: data leakage
      "--tasks", "pick_and_place_simple-Mug-None-Desk-308/trial_T20190909_203041_433487"],
     "belongs to split 'valid_unseen', not 'train': refusing to mix splits"),
    (["--env", "scienceworld", "--tasks", "boil/9999"],
     "Error: ScienceWorld task 'boil/9999': boil has variations 0-29 (train 0-13, dev 14-20, test 21-29) "
     "(list the valid ids: cb-agent tasks --env scienceworld --split train)"),
    (["--env", "scienceworld", "--split", "train", "--tasks", "boil/25"],  # a test variation as train
     "Error: scienceworld task 'boil/25' belongs to split 'test', not 'train': refusing to mix splits"),
    (["--env", "textworld", "--split", "train", "--tasks", "cooking/test/100001"],
     "belongs to split 'test', not 'train'"),
    (["--env", "scienceworld", "--split", "valid"], "Error: unknown ScienceWorld split 'valid'"),
])
def test_cli_collect_refuses_bad_ids_and_other_splits_in_one_line(tmp_path, args, message):
    from agent_shell.cli import main

    result = CliRunner().invoke(main, ["collect", *args, "--out", str(tmp_path / "x.jsonl")])
    assert result.exit_code == 1 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "x.jsonl").exists()
