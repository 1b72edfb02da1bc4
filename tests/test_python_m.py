"""``python -m agent_shell`` runs the ``cb-agent`` command line (for when the script is not on the path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agent_shell.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]


def python_m(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "agent_shell", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


def test_python_m_agent_shell_is_the_cb_agent_command_line():
    res = python_m("--help")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("Usage: cb-agent ")
    listed = {line.split()[0] for line in res.stdout.split("Commands:", 1)[1].splitlines() if line.strip()}
    assert listed == set(COMMANDS)


def test_python_m_agent_shell_passes_arguments_and_exit_codes_through():
    res = python_m("tasks", "--env", "no-such-env")
    assert res.returncode == 2  # click's usage error, as `cb-agent tasks --env no-such-env` gives
    assert "no-such-env" in res.stderr
