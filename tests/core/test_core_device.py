"""cb_core leaves GPU memory to the LM: JAX allocates on demand unless the user chose otherwise."""

import os
import subprocess
import sys

SCRIPT = "import os, cb_core; print(os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'])"


def run(env_extra: dict) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_PYTHON_CLIENT")} | env_extra
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_importing_cb_core_turns_jax_preallocation_off():
    assert run({}) == "false"


def test_a_users_own_setting_is_kept():
    assert run({"XLA_PYTHON_CLIENT_PREALLOCATE": "true", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.2"}) == "true"
