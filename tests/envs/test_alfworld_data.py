"""Where ALFWorld's game files are found: ``$CB_AGENT_ALFWORLD_DATA``, else the ALFWorld package's own
folder (``$ALFWORLD_DATA/json_2.1.1``, by default under ``~/.cache/alfworld``, where
``alfworld-download`` writes), else the folder beside the checkout; an error lists every place looked
in. Each test builds its own folders (one fake game each) under a temporary home and checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import cb_io.paths
from cb_io.records import SetupError
from envs.alfworld import AlfworldEnv

GAME = "pick_and_place_simple-Apple-None-Box-{}/trial_T1"


def put_game(json_dir: Path, scene: int, split: str = "valid_unseen") -> str:
    """One game file at ``json_dir/split/<folder>/<trial>/game.tw-pddl``; returns its task id."""
    task_id = GAME.format(scene)
    game = json_dir / split / task_id / "game.tw-pddl"
    game.parent.mkdir(parents=True)
    game.write_text("{}")
    return task_id


@pytest.fixture()
def places(tmp_path, monkeypatch):
    """No variable set; home and the checkout's parent are fresh folders. Returns the three
    ``json_2.1.1`` folders a user may have: (named by $ALFWORLD_DATA, ALFWorld's default under the
    home, beside the checkout)."""
    monkeypatch.delenv("CB_AGENT_ALFWORLD_DATA", raising=False)
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(cb_io.paths, "REPO_ROOT", tmp_path / "work" / "cb-agent")
    return (tmp_path / "alfworld-data" / "json_2.1.1", tmp_path / "home" / ".cache" / "alfworld" / "json_2.1.1",
            tmp_path / "work" / "shared" / "alfworld" / "json_2.1.1")


def test_the_files_alfworld_download_wrote_to_alfworld_data_come_before_the_checkout_s(places, monkeypatch):
    named, _, beside = places
    monkeypatch.setenv("ALFWORLD_DATA", str(named.parent))
    downloaded = put_game(named, 1)
    put_game(beside, 2)
    env = AlfworldEnv()
    assert env.data_dir == named
    assert env.tasks("valid_unseen") == [downloaded]


def test_alfworld_s_default_folder_under_home_is_found_when_alfworld_data_is_unset(places):
    _, default, beside = places
    downloaded = put_game(default, 3)
    put_game(beside, 4)
    assert AlfworldEnv().tasks("valid_unseen") == [downloaded]


def test_the_folder_beside_the_checkout_is_the_last_place(places):
    *_, beside = places
    only = put_game(beside, 5)
    assert AlfworldEnv().tasks("valid_unseen") == [only]


def test_cb_agent_alfworld_data_comes_first_and_is_never_passed_over(places, tmp_path, monkeypatch):
    named, default, beside = places
    for i, folder in enumerate(places):
        put_game(folder, 10 + i)
    monkeypatch.setenv("ALFWORLD_DATA", str(named.parent))
    monkeypatch.setenv("CB_AGENT_ALFWORLD_DATA", str(tmp_path / "mine"))
    mine = put_game(tmp_path / "mine", 6, split="train")
    assert AlfworldEnv().tasks("train") == [mine]
    monkeypatch.setenv("CB_AGENT_ALFWORLD_DATA", str(tmp_path / "typo"))
    with pytest.raises(SetupError) as err:
        AlfworldEnv()
    assert str(tmp_path / "typo") in str(err.value)
    assert not any(str(folder) in str(err.value) for folder in places)


def test_no_game_files_anywhere_is_one_line_naming_every_place_and_the_download_command(places, monkeypatch):
    named, default, beside = places
    default.mkdir(parents=True)  # importing alfworld creates its folder; the games are not in it yet
    with pytest.raises(SetupError) as err:
        AlfworldEnv()
    message = str(err.value)
    assert "\n" not in message and "alfworld-download" in message
    assert str(default) in message and str(beside) in message
    monkeypatch.setenv("ALFWORLD_DATA", str(named.parent))
    with pytest.raises(SetupError, match="alfworld-download") as err:
        AlfworldEnv()
    assert str(named) in str(err.value) and str(beside) in str(err.value) and str(default) not in str(err.value)


def test_the_default_folder_is_the_installed_alfworld_package_s(tmp_path, monkeypatch):
    """The package's own default, read from ``alfworld.info`` in a fresh interpreter under the same home."""
    from envs.alfworld import ALFWORLD_DEFAULT_DATA

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    proc = subprocess.run([sys.executable, "-c", "import alfworld.info as i; print(i.ALFWORLD_DATA)"],
                          env=dict(os.environ), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()) == Path(ALFWORLD_DEFAULT_DATA).expanduser() == tmp_path / ".cache" / "alfworld"
