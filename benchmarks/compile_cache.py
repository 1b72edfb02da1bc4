"""Warm one-off ``cb-agent fit``: cb_core's digest-checked executable store against JAX's own
persistent compilation cache alone.

Data: :func:`cb_core.synthetic.synthetic_decisions` at N = 125, d = 5120 (14B width; about 25
candidates a decision), float32 fit with the default solver. Two cache folders, each warmed by
one cold run first:

* ``store``: ``cb-agent fit`` as shipped: JAX's cache plus cb_core's stored executables, each
  checked against its SHA-256 digest before it is deserialized (no tracing, lowering or
  compiling in the new process).
* ``jax-cache``: the same command with the executable store switched off in the process
  (``cb_core.cache._EXECUTABLES = None`` after the cache is enabled): every new process traces
  and lowers the fit to find it in JAX's cache.

Each round runs both once, in alternating order; the figure is the wall time from process start
to saved concept (``subprocess.run`` around the command), with the command's own ``fit_s``. Printed
unrounded: every round, the medians and the ratio jax-cache / store.

Run:   .venv/bin/python benchmarks/compile_cache.py [--rounds 5] [--n 125] [--d 5120] [--tiny]
(``--tiny``: N = 12, d = 16, one round: a smoke test, not a measurement.)
Not a test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

JAX_CACHE_ONLY = """
import sys
import cb_core.cache as cache
enable = cache.enable_persistent_cache
def jax_cache_only(directory, write_file):
    out = enable(directory, write_file)
    cache._EXECUTABLES = None  # the executable store off: JAX's persistent cache alone
    return out
cache.enable_persistent_cache = jax_cache_only
from agent_shell.cli import main
main(sys.argv[1:])
"""


def run(variant: str, npz: str, tmp: str) -> dict:
    code = "from agent_shell.cli import main; import sys; main(sys.argv[1:])" if variant == "store" \
        else JAX_CACHE_ONLY
    env = dict(os.environ, CB_AGENT_CACHE=os.path.join(tmp, f"cache-{variant}"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-c", code, "fit", npz, "--out", os.path.join(tmp, f"{variant}.safetensors"),
           "--json"]
    start = time.perf_counter()
    res = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    out = json.loads(res.stdout.strip().splitlines()[-1])
    return dict(wall=wall, fit_s=out["timings"]["fit_s"], converged=out["converged"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=125)
    ap.add_argument("--d", type=int, default=5120)
    ap.add_argument("--tiny", action="store_true", help="smoke test: N = 12, d = 16, one round")
    args = ap.parse_args(argv)
    if args.tiny:
        args.n, args.d, args.rounds = 12, 16, 1
    from cb_core.decision_file import write_decisions
    from cb_core.synthetic import synthetic_decisions

    variants = ("store", "jax-cache")
    with tempfile.TemporaryDirectory() as tmp:
        npz = os.path.join(tmp, "d.npz")
        with open(npz, "wb") as f:
            write_decisions(f, synthetic_decisions(args.n, args.d, seed=0))
        print(f"N = {args.n}, d = {args.d}, float32, {os.cpu_count()} CPUs; cold runs:",
              {v: run(v, npz, tmp)["wall"] for v in variants}, flush=True)
        times: dict[str, list[dict]] = {v: [] for v in variants}
        for k in range(args.rounds):
            for v in (variants if k % 2 == 0 else variants[::-1]):
                times[v].append(run(v, npz, tmp))
                print(f"round {k} {v}: wall {times[v][-1]['wall']!r} s, fit_s {times[v][-1]['fit_s']!r} s, "
                      f"converged {times[v][-1]['converged']}", flush=True)
        med = {v: statistics.median(t["wall"] for t in times[v]) for v in variants}
        fit = {v: statistics.median(t["fit_s"] for t in times[v]) for v in variants}
        for v in variants:
            print(f"median {v}: wall {med[v]!r} s, fit_s {fit[v]!r} s")
        print(f"ratio jax-cache / store (median wall): {med['jax-cache'] / med['store']!r}")


if __name__ == "__main__":
    main()
