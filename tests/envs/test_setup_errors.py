"""Set-up errors are one line that says what to do, printed before anything heavy loads; every
environment's default evaluation split exists."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_shell.run_config import RunConfig
from envs import ENVIRONMENTS, make_env

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("transformers", "jax", "alfworld", "textworld")
#: ``cb-agent run`` in a fresh interpreter, then which of :data:`HEAVY` it imported.
RUN = ("import atexit, sys; atexit.register(lambda: print('loaded:', [m for m in %r if m in sys.modules], "
       "file=sys.stderr)); from agent_shell.cli import main; main(sys.argv[1:])" % (HEAVY,))


def test_game_files_missing_where_the_package_is_installed_is_one_line(tmp_path):
    """As after a non-editable install (the games are looked for beside site-packages): no
    traceback, the variable to set, and no model, JAX or engine import."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CB_AGENT_ALFWORLD_DATA": str(tmp_path / "site-packages" / "shared")}
    proc = subprocess.run([sys.executable, "-c", RUN, "run", "--env", "alfworld"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"Error: ALFWorld game files not found (looked in $CB_AGENT_ALFWORLD_DATA: {tmp_path / 'site-packages' / 'shared'}); "
        "download them with `alfworld-download` (into $ALFWORLD_DATA, default ~/.cache/alfworld) or set "
        "CB_AGENT_ALFWORLD_DATA to a json_2.1.1 folder (the one holding train/ and valid_unseen/)",
        "loaded: []"]


@pytest.mark.parametrize("name", sorted(ENVIRONMENTS))
def test_the_default_split_of_every_environment_has_games(name):
    from agent_shell.configure import resolve, task_ids

    config = resolve(RunConfig(env=name), backbone=False)
    env = make_env(name)
    try:
        assert config.split in env.splits
        assert task_ids(config, env)  # the default slice, checked without starting the engine
    finally:
        env.close()
