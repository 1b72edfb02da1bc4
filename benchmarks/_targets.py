"""What every benchmark script reports the same way: a ratio against its target, and the machine.

A ratio is printed unrounded (``repr``) and compared unrounded with its target, so a figure of
1.696 never reads as meeting 1.7. The verdict is a dict (for the script's JSON) and a line (for
its printout). Not a benchmark itself (no ``main``).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
from typing import Iterator, Sequence

#: the CPU flags that decide whether bfloat16 matrix products run natively
BF16_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def verdict(name: str, value: float, target: float, at_most: bool) -> dict:
    """``{"name", "value", "target", "met"}`` for a ratio ``value`` that must be ``<= target``
    (``at_most``) or ``>= target``; ``target`` is a string such as ``"<= 1.3"``."""
    met = value <= target if at_most else value >= target
    return {"name": name, "value": value, "target": f"{'<=' if at_most else '>='} {target!r}", "met": bool(met)}


def verdict_line(v: dict) -> str:
    """``name = 1.5604... (target <= 1.3): NOT MET`` for a :func:`verdict`."""
    return f"{v['name']} = {v['value']!r} (target {v['target']}): {'MET' if v['met'] else 'NOT MET'}"


def report(figures: dict, out: str | None) -> int:
    """Print ``figures`` as JSON and a :func:`verdict_line` per entry of its ``verdicts``, write the
    JSON to ``out`` too when given; 0 (the exit status)."""
    import json
    from pathlib import Path

    text = json.dumps(figures, indent=1)
    print(text)
    for v in figures.get("verdicts", []):
        print(verdict_line(v))
    if out:
        Path(out).write_text(text)
    return 0


def median_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """The median of the paired ratios ``numerators[i] / denominators[i]`` (paired: each pair was
    measured in the same round, so a slower machine in one round moves both)."""
    if len(numerators) != len(denominators) or not numerators:
        raise ValueError(f"paired ratios need equally many values, got {len(numerators)} and {len(denominators)}")
    return statistics.median(a / b for a, b in zip(numerators, denominators))


def rotated(items: Sequence, k: int) -> list:
    """``items`` rotated by ``k`` places: round ``k`` runs them in this order, so no item always
    runs first or after the same neighbour on a shared machine."""
    k %= max(len(items), 1)
    return [*items[k:], *items[:k]]


def pinned_env(threads: int | None, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default this process's environment) with every numeric library on ``threads``
    threads alike: OpenMP / OpenBLAS / MKL (numpy, scipy, torch's intra-op pool) and XLA's CPU
    client (its Eigen pool and intra-op parallelism); None: the libraries' own defaults (every CPU).
    Read when the libraries load: a child process's environment, or this one's before any import."""
    env = dict(os.environ if env is None else env)
    if threads is None:
        return env
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(threads)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "multi_thread_eigen" not in f
             and "intra_op_parallelism_threads" not in f]
    flags += [f"--xla_cpu_multi_thread_eigen={'false' if threads == 1 else 'true'}",
              f"intra_op_parallelism_threads={threads}"]
    env["XLA_FLAGS"] = " ".join(flags)
    return env


@contextlib.contextmanager
def pinned(threads: int | None) -> Iterator[None]:
    """This process pinned as :func:`pinned_env` pins a child, for the block: its environment (read
    by torch and JAX when they load, so enter it before importing them), its CPU affinity (its
    first ``threads`` allowed CPUs, as ``taskset`` would) and, when torch is already loaded, torch's
    pool; None: unchanged. All are put back after."""
    if threads is None:
        yield
        return
    env, allowed = dict(os.environ), os.sched_getaffinity(0)
    torch = sys.modules.get("torch")  # already loaded: its pool is set directly
    before = torch.get_num_threads() if torch is not None else None
    os.environ.update(pinned_env(threads))
    os.sched_setaffinity(0, set(sorted(allowed)[:threads]))
    if torch is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)
        os.environ.clear()
        os.environ.update(env)
        if torch is not None:
            torch.set_num_threads(before)


def cpu_flags() -> dict:
    """The CPU's bfloat16-relevant flags from /proc/cpuinfo (empty off Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(" ".join(line for line in f if line.startswith("flags")).split())
    except OSError:
        return {}
    return {f: f in flags for f in BF16_FLAGS}


def machine() -> dict:
    """CPU count, load averages (1, 5, 15 min) and the bfloat16 flags: what a figure's row states."""
    return {"cpus": os.cpu_count(), "load_average": list(os.getloadavg()), "cpu_flags": cpu_flags()}


__all__ = ["BF16_FLAGS", "cpu_flags", "machine", "median_ratio", "pinned", "pinned_env", "report", "rotated", "verdict",
           "verdict_line"]
