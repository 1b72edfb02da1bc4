"""JAX's platform setting (``JAX_PLATFORMS``, or ``jax.config.jax_platforms``) checked once, before
the JAX backend picks a device: a platform JAX cannot start here is one line naming the setting and
JAX's reason, not the traceback (or the bare ``AssertionError``) of JAX's first device query.

Must not import the agents, the environments or torch.
"""

from __future__ import annotations

import functools
import os
import re


class JaxPlatformError(ValueError):
    """JAX cannot start the platforms its setting names here: the machine's setting, not an option."""


def check_jax_platforms() -> None:
    """Start JAX's platforms (once per process and setting) and refuse a setting it cannot start.

    Raises:
        JaxPlatformError: JAX cannot start a platform it is told to (``JAX_PLATFORMS=tpu`` on a
            machine without one, an unknown name, ``cuda`` without a visible NVIDIA GPU), or, with
            no setting, a platform plugin that fails: one line naming the setting and JAX's reason.
    """
    import cb_core.cache  # noqa: F401 - importing cb_core sets its JAX memory settings, before JAX starts
    import jax

    start_hosts(os.environ.get(HOSTS_VARIABLE, ""))
    problem = _problem(str(jax.config.jax_platforms or ""))
    if problem:
        raise JaxPlatformError(problem)


#: The environment variable that starts JAX's multi-host runtime before the first device query:
#: ``auto`` (``jax.distributed.initialize()`` finds its peers: TPU pod slices, SLURM, Open MPI,
#: Kubernetes) or ``ADDRESS:PORT/PROCESSES/ID`` (the coordinator, how many processes, this one's id).
HOSTS_VARIABLE = "CB_AGENT_JAX_HOSTS"


@functools.lru_cache(maxsize=None)
def start_hosts(setting: str) -> None:
    """Join the processes ``setting`` (:data:`HOSTS_VARIABLE`'s value) names, once per process; an
    empty setting is one host. On CPUs the collectives between hosts go through gloo.

    Raises:
        JaxPlatformError: a setting that is neither ``auto`` nor ``ADDRESS:PORT/PROCESSES/ID``.
    """
    if not setting:
        return
    import jax

    found = re.fullmatch(r"([^/\s]+:\d+)/(\d+)/(\d+)", setting.strip())
    if setting.strip() != "auto" and (found is None or int(found.group(3)) >= int(found.group(2))):
        raise JaxPlatformError(f"{HOSTS_VARIABLE}={setting!r} is not 'auto' or ADDRESS:PORT/PROCESSES/ID "
                               "(e.g. 10.0.0.1:1234/2/0, the id below the number of processes)")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU hosts; GPUs and TPUs use their own
    if found is None:
        jax.distributed.initialize()
    else:
        jax.distributed.initialize(coordinator_address=found.group(1), num_processes=int(found.group(2)),
                                   process_id=int(found.group(3)))


@functools.lru_cache(maxsize=None)
def _problem(setting: str) -> str | None:
    """What keeps JAX from starting the platforms ``setting`` names (None: they start)."""
    import jax

    try:
        jax.devices()
        return None
    except RuntimeError as err:
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        text = re.sub(r"\s*\((set JAX_PLATFORMS|you may need).*$", "", text)
        found = re.match(r"Unable to initialize backend '([^']+)': (.*)", text)
        reason = f"JAX cannot start its {found.group(1)!r} platform ({found.group(2)})" if found else text
    except AssertionError:  # every named platform was skipped: cuda without a visible NVIDIA GPU
        gpu = any(p.strip() in ("cuda", "gpu", "rocm") for p in setting.split(","))
        reason = "JAX can start none of the platforms it names here" + (
            " (cuda and rocm need a visible GPU)" if gpu else "")
    if setting:
        return (f"JAX_PLATFORMS={setting!r}: {reason}; unset JAX_PLATFORMS to let JAX choose, or name only "
                "platforms this machine has")
    return f"{reason}; set JAX_PLATFORMS=cpu to skip the platform that fails"


__all__ = ["HOSTS_VARIABLE", "JaxPlatformError", "check_jax_platforms", "start_hosts"]
