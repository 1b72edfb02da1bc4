"""Trajectory schema, atomic JSONL storage, and the expert decisions of a trajectory (seed Eq. 5,
:mod:`agent_shell.expert_decisions`); no engine needed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent_shell.candidates import drop_excluded
from agent_shell.expert_decisions import capped_candidates, decision_examples
from cb_io.records import SCHEMA_VERSION, Step, Trajectory, completed_task_ids, read_trajectories
from cb_io.storage import append_jsonl


def make_trajectory(task_id="t1") -> Trajectory:
    steps = [
        Step("env", "look", "You see a desk 1.", ["go to desk 1", "look", "inventory"], False, False, 0.0),
        Step("think", "think: the mug is probably on the desk", "OK.", None, False, False, 0.0),
        Step("env", "go to desk 1", "On the desk 1, you see a mug 1.", ["go to desk 1", "look"], False, False, 0.0),
        Step("env", "take mug 1 from desk 1", "You pick up the mug 1.", ["take mug 1 from desk 1", "look"], True, True, 1.0,
             {"note": "x"}),
    ]
    return Trajectory("alfworld", task_id, "pick_and_place_simple", "Your task is to: put a mug in desk.",
                      "You are in the middle of a room.", steps, True, 1.0, {"expert": "test"})


def test_round_trip_through_jsonl(tmp_path):
    path = tmp_path / "t.jsonl"
    a, b = make_trajectory("a"), make_trajectory("b")
    append_jsonl(path, a)
    append_jsonl(path, b.to_record())
    assert read_trajectories(path) == [a, b]
    assert completed_task_ids(path) == {"a", "b"}
    assert a.to_record()["schema_version"] == SCHEMA_VERSION


def test_decision_examples_count_history_and_expert_index():
    traj = make_trajectory()
    examples, skipped = decision_examples(traj)
    assert (len(examples), skipped) == (3, 0)
    second = examples[1]
    assert second.expert_action == "go to desk 1"
    assert second.candidates[second.expert_index] == traj.steps[2].action
    assert [s.action for s in second.history] == ["look", "think: the mug is probably on the desk"]
    # the context never contains the action's own feedback
    assert all(s.observation != "On the desk 1, you see a mug 1." for s in second.history)


def test_filtered_expert_look_is_skipped_and_counted():
    examples, skipped = decision_examples(make_trajectory(), drop_excluded)
    assert (len(examples), skipped) == (2, 1)
    assert all("look" not in e.candidates for e in examples)
    assert examples[0].history[0].action == "look"  # the skipped step still shapes later contexts


def test_capped_candidate_sets_keep_the_expert_action_and_a_seeded_sample_in_order():
    many = [f"go to shelf {i}" for i in range(1000)]
    expert = "go to shelf 737"
    capped = capped_candidates(many, expert, 64, "boil/0\x005")
    assert len(capped) == 64 and expert in capped
    assert capped == sorted(capped, key=many.index)  # the original order
    assert capped == capped_candidates(many, expert, 64, "boil/0\x005")  # the same key, the same draw
    assert capped != capped_candidates(many, expert, 64, "boil/0\x006")  # another step, another draw
    assert capped_candidates(many[:10], expert, 64, "k") == many[:10]  # small sets stay whole
    assert capped_candidates(many, expert, 0, "k") == many  # 0: no cap
    # through decision_examples: every set capped, the expert index still the expert's action
    traj = make_trajectory()
    traj.steps[2] = Step("env", "go to desk 1", "On the desk 1, you see a mug 1.",
                         ["go to desk 1"] + many, False, False, 0.0)
    examples, skipped = decision_examples(traj, max_candidates=8)
    assert skipped == 0 and [len(e.candidates) for e in examples] == [3, 8, 2]
    assert examples[1].expert_action == "go to desk 1"


def test_expert_action_missing_from_saved_set_is_an_error():
    traj = make_trajectory("broken")
    traj.steps[2] = Step("env", "go to desk 9", "", ["go to desk 1"], False, False, 0.0)
    with pytest.raises(ValueError, match=r"'broken'.*step 2"):
        decision_examples(traj)


def test_truncated_line_is_reported_with_its_line_number(tmp_path):
    path = tmp_path / "t.jsonl"
    append_jsonl(path, make_trajectory("a"))
    append_jsonl(path, make_trajectory("b"))
    with open(path, "ab") as fh:  # an interrupted write: half a record, no newline
        fh.write(make_trajectory("c").to_record().__repr__().encode()[:40])
    with pytest.raises(ValueError, match=r":3: .*truncated"):
        read_trajectories(path)
    reported = []
    kept = read_trajectories(path, on_error="skip", report=reported.append)
    assert [t.task_id for t in kept] == ["a", "b"]
    assert [r.line_number for r in reported] == [3]


def test_append_after_a_torn_line_keeps_the_new_record_whole(tmp_path):
    path = tmp_path / "t.jsonl"
    append_jsonl(path, make_trajectory("a"))
    with open(path, "ab") as fh:
        fh.write(b'{"schema_version": 1, "env": "alf')
    append_jsonl(path, make_trajectory("d"))
    reported = []
    kept = read_trajectories(path, on_error="skip", report=reported.append)
    assert [t.task_id for t in kept] == ["a", "d"]
    assert [r.line_number for r in reported] == [2]
    with pytest.warns(UserWarning, match=":2:"):
        assert completed_task_ids(path) == {"a", "d"}


def test_malformed_record_names_line_and_field(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"schema_version": 1, "env": "alfworld"}\n')
    with pytest.raises(ValueError, match=r":1: .*lacks field"):
        read_trajectories(path)
    path.write_bytes(b'{"schema_version": 99}\n')
    with pytest.raises(ValueError, match="schema_version 99"):
        read_trajectories(path)


def test_step_kind_and_candidates_are_validated():
    with pytest.raises(ValueError):
        Step("env", "look", "", None, False, False, 0.0)
    with pytest.raises(ValueError):
        Step("think", "think: x", "OK.", ["look"], False, False, 0.0)
    with pytest.raises(ValueError):
        Step("act", "look", "", [], False, False, 0.0)


def test_repair_moves_unreadable_lines_aside_and_keeps_the_rest_byte_for_byte(tmp_path):
    from cb_io.storage import repair_jsonl

    path = tmp_path / "t.jsonl"
    append_jsonl(path, make_trajectory("a"))
    with open(path, "ab") as fh:
        fh.write(b'{"schema_version": 1, "env": "alf')  # torn by a crash, then closed by the next append
    append_jsonl(path, make_trajectory("b"))
    with open(path, "ab") as fh:
        fh.write(b'{"other": "kind of record"}\n')  # JSON of another kind: not ours to move
    good = path.read_bytes()
    with open(path, "ab") as fh:
        fh.write(b'{"schema_version": 1, "env": "te')  # torn last line
    moved = repair_jsonl(path)
    assert [(m.line_number, m.error.split(" ")[0]) for m in moved] == [(2, "not"), (5, "truncated")]
    lines = good.splitlines(keepends=True)
    assert path.read_bytes() == lines[0] + lines[2] + lines[3]
    assert (tmp_path / "t.jsonl.torn").read_bytes() == b'{"schema_version": 1, "env": "alf\n{"schema_version": 1, "env": "te\n'
    assert repair_jsonl(path) == [] and repair_jsonl(tmp_path / "missing.jsonl") == []


def test_stamped_folder_builds_once_per_stamp_and_never_leaves_half_a_folder(tmp_path):
    from cb_io.storage import stamped_folder

    builds = []

    def build(folder):
        builds.append(folder)
        (folder / "weights").write_text(str(len(builds)))

    target = tmp_path / "models" / "m"
    assert stamped_folder(target, {"v": 1}, build) == target and (target / "weights").read_text() == "1"
    stamped_folder(target, {"v": 1}, build)
    assert len(builds) == 1  # cached
    stamped_folder(target, {"v": 2}, build)
    assert (target / "weights").read_text() == "2"  # a new source rebuilds

    def broken(folder):
        (folder / "half").write_text("x")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        stamped_folder(tmp_path / "models" / "other", {"v": 1}, broken)
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["m"]


def test_atomic_folder_appears_whole_or_not_at_all(tmp_path):
    from cb_io.storage import atomic_folder

    target = tmp_path / "models" / "m"
    with pytest.raises(RuntimeError, match="interrupted"):
        with atomic_folder(target) as tmp:
            (tmp / "half.bin").write_bytes(b"x")
            raise RuntimeError("interrupted")
    assert not target.exists() and list(target.parent.iterdir()) == []  # nothing half-written is left
    with atomic_folder(target) as tmp:
        (tmp / "weights.bin").write_bytes(b"old")
    with atomic_folder(target) as tmp:  # a stale folder is replaced as a whole
        (tmp / "config.json").write_text("{}")
    assert sorted(p.name for p in target.iterdir()) == ["config.json"]
    mask = os.umask(0)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o777 & ~mask  # a new folder's mode, not mkdtemp's private 0700


def _killed_inside(tmp_path, code: str) -> None:
    """Run ``code`` in a fresh process that SIGKILLs itself where ``code`` says ``KILL``."""
    import subprocess
    import sys
    import textwrap

    from cb_io.paths import REPO_ROOT

    script = "import os, signal\nfrom pathlib import Path\n" + textwrap.dedent(code).replace(
        "KILL", "os.kill(os.getpid(), signal.SIGKILL)")
    res = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                         cwd=tmp_path, timeout=120)
    assert res.returncode == -9


@pytest.mark.parametrize("writer", ["atomic_folder", "atomic_path"])
def test_the_next_write_removes_what_a_killed_write_left_and_nothing_of_a_running_one(tmp_path, writer):
    """A process killed inside an atomic write (a ``--lam auto`` fit staging the concepts' cache
    folder, a chart written into ``--out-dir``) leaves its temporary entry; the next atomic write
    into that folder removes it (its process is gone), while a temporary entry of a write still
    running (this process's) and every other file stay."""
    from cb_io.storage import atomic_folder, atomic_path, remove_leftovers, write_bytes_atomic

    target = tmp_path / "out" / ("key" if writer == "atomic_folder" else "strength.json")
    _killed_inside(tmp_path, f"""
        from cb_io.storage import {writer}
        with {writer}(Path({str(target)!r})) as tmp:
            (Path(tmp) / "cooking.safetensors" if Path(tmp).is_dir() else Path(tmp)).write_bytes(b"half")
            KILL
        """)
    left = [p.name for p in (tmp_path / "out").iterdir()]
    assert len(left) == 1 and ".tmp-" in left[0] and str(os.getpid()) not in left[0], left
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with atomic_folder(target) if writer == "atomic_folder" else atomic_path(target) as tmp:  # the next write
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(["notes.txt", Path(tmp).name])
        assert remove_leftovers(tmp_path / "out", force=True) == []  # this write's own entry stays
        (Path(tmp) / "cooking.safetensors" if Path(tmp).is_dir() else Path(tmp)).write_bytes(b"whole")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(["notes.txt", target.name])
    write_bytes_atomic(tmp_path / "out" / "notes.txt", b"again")
    assert (tmp_path / "out" / "notes.txt").read_bytes() == b"again"


@pytest.mark.parametrize("side", ["lock", "torn", "line"])
def test_no_file_beside_an_output_is_written_through_a_link(tmp_path, side):
    """The claim's lock sidecar, the torn-line side file and an appended file itself: a link at any
    of them is refused in one line and the file it points to keeps its bytes."""
    from cb_io.storage import append_jsonl, claim_writer, repair_jsonl

    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious\n")
    out = tmp_path / "out" / "results.jsonl"
    out.parent.mkdir()
    out.write_bytes(b'{"a": 1}\n{"b": ')  # a torn last line for repair_jsonl to move aside
    link = {"lock": out.parent / ".results.jsonl.lock", "torn": out.parent / "results.jsonl.torn",
            "line": out}[side]
    if side == "line":
        out.unlink()
    link.symlink_to(victim)
    act = {"lock": lambda: claim_writer(out), "torn": lambda: repair_jsonl(out),
           "line": lambda: append_jsonl(out, {"c": 3})}[side]
    with pytest.raises(ValueError, match="is a symbolic link .*never written through a link") as err:
        act()
    assert "\n" not in str(err.value)
    assert victim.read_bytes() == b"precious\n" and link.is_symlink()
    if side == "torn":
        assert out.read_bytes() == b'{"a": 1}\n{"b": '  # nothing moved either


@pytest.mark.parametrize("below", [("x.json",), ("sub", "x.json")])
def test_an_output_below_a_regular_file_is_one_output_error_naming_the_file(tmp_path, below):
    """A regular file where an output's folder would be: OutputError naming the output and the file on the
    way, for the atomic writers and the appending writer's claim; the file is left as it was."""
    from cb_io.storage import OutputError, claim_writer, write_json_atomic

    (tmp_path / "afile").write_text("kept\n")
    target = tmp_path.joinpath("afile", *below)
    for write in (lambda: write_json_atomic(target, {"a": 1}), lambda: claim_writer(target)):
        with pytest.raises(OutputError) as caught:
            write()
        assert str(caught.value) == f"cannot write {target}: {tmp_path / 'afile'} is a file, not a folder; choose another path"
    assert (tmp_path / "afile").read_text() == "kept\n"


def test_a_folder_removed_while_it_is_created_is_created_again(tmp_path, monkeypatch):
    """Another process removing an emptied folder between this one's mkdir and its check (a
    clean-up of emptied folders while a writer creates them) is no file on the way: the folder is created again and the write lands; a folder removed at every
    attempt lets the FileExistsError pass (an episode's fault, retried), never an OutputError."""
    import errno

    from cb_io.storage import OutputError, write_json_atomic

    real = os.makedirs
    target = tmp_path / "results.jsonl.partial" / "agent" / "task.json"
    races = {"left": 1}

    def racing(name, *args, **kwargs):  # mkdir met the folder, which was gone by the isdir check
        if races["left"]:
            races["left"] -= 1
            raise FileExistsError(errno.EEXIST, "File exists", name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", racing)
    write_json_atomic(target, {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1} and races["left"] == 0

    races["left"] = 10**6
    with pytest.raises(FileExistsError) as caught:
        write_json_atomic(tmp_path / "other" / "task.json", {"a": 1})
    assert not isinstance(caught.value, OutputError)
