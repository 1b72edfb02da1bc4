"""Fit speed: time to a common objective gap against honest baselines, the one-off CLI fit, and
the six per-type concepts fitted at the start of ``cb-agent run``.

Data: :func:`cb_core.synthetic.synthetic_decisions` (about 25 candidates a decision), float32, at
N = 50, d = 2560 (Qwen3-4B width) and N = 125, d = 5120 (14B width), in two regimes:

* ``well``: hidden states without low-rank structure (``rank=0``): well conditioned, the seed's
  Adam converges (||grad|| < 1e-4) in a few hundred steps;
* ``today``: correlated hidden states (``rank=16``, the data of the earlier benchmark): ill
  conditioned; Adam stops at its 1,500-step cap without converging.

Methods (``--methods``, default all), each in its own worker process (``_fit_workers.py``; no
thread pool shared between them, and one second idle before each timed fit, so the thread pools
of the fit before, e.g. OpenBLAS's, have stopped spinning), warmed up once (compiling the
cb_core programs), then ``--rounds`` rounds in rotating order; every figure is the median over
rounds:

* ``torch adam``: the seed protocol in PyTorch (float32), vectorised over the padded
  [N, M_max, m] layout with features and prior computed *before* the timed loop: Adam lr 0.01
  from alpha = 0, stop at ||grad|| < 1e-4 or 1,500 steps; with the faster of 1 and all threads.
* ``scipy L-BFGS-B f64`` / ``f32``: a numpy objective and gradient in float64 / float32 (a
  memory-bound fit reads half the bytes in float32), features computed before the timed call;
  scipy's own stop (gtol 1e-5).
* ``cb_core subspace`` / ``newton`` / ``lbfgs`` / ``adam``: :func:`cb_core.fit` in float32,
  timed whole (validation, padding, features, solve, certificate; compiled at the warm-up), each
  with its own stop; ``cb_core adam`` is the seed protocol of ``torch adam`` in cb_core.

The ``passes`` column counts reads of the feature (or hidden-state) matrix, by measurement: the
fits are memory-bound, so it is the cost that does not depend on the machine's load. torch and
scipy count their objective evaluations (two reads each: Phi alpha, then Phi^T r); cb_core's
fit is run a second time with a counted callback compiled into its program at every
matrix-vector product and at the features' statistics (``_fit_workers.instrumented``).

Gap: every alpha is judged by one float64 numpy objective (written in ``_fit_workers.py`` from
the seed's equations) against f*, the optimum of a float64 cb_core Newton fit to ||grad|| <= 1e-10.
*Time to gap <= 1e-6*, for every method, from recorded iterates: iterates and their time
stamps are recorded inside the timed run and judged afterwards (generous to the baselines,
whose own stopping rules do not know f*); cb_core's come from the instrumented run (a callback
at each iterate, its clock started before validation), plus the plain run's result at its own
stop. The headline compares the fastest baseline's time to the gap with the default solver's
whole fit to its own stop (when its gap there is <= 1e-6), unrounded, with the target: at
least 1.5x. Every method runs on the same number of threads (``--threads``, default 1: numpy's
BLAS, XLA's CPU client and torch alike, :func:`_fit_workers.pinned_env`); the load average is
recorded before and after.

Then the one-off process (``cb-agent fit`` from process start to saved concept, a cold and a
warm cache, with the command's own breakdown) and the six per-type concepts (d = 576, shapes of
``cb-agent run``'s demonstrations) fitted warm in one process and in a new process that loads
the stored executables.

Last, many concepts in one program (:func:`many_concepts`, in a worker pinned like the others): 6 task
types x 10 strengths x 5 folds = 300 fits at N = 50 decisions per type (``--many-n 125``), d = 2560,
as one :func:`cb_core.fit_many` call per task type against 300 sequential cb_core fits and 300 sequential scipy
L-BFGS-B float32 fits, each also warm-started along the strength path; every fit stops at
||grad|| <= 1e-3; target: the faster sequential baseline over the batched fit at least 3x.

Run:   .venv/bin/python benchmarks/fit_speed.py [--sizes 50x2560,125x5120] [--regimes well,today]
                                                [--rounds 3] [--methods M1,M2] [--threads 1] [--no-cli] [--json OUT]
                                                [--tiny] [--only-many] [--many-n 50] [--many-d 2560]
(``--tiny``: every path once on N = 12, d = 16 (many concepts: 2 x 3 x 2 fits at N = 10): a smoke
test, not a measurement.)
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _fit_workers import Worker, float64_model, load_npz, objectives  # noqa: E402
from _targets import machine, rotated, verdict, verdict_line  # noqa: E402

GAP = 1e-6
PAUSE_S = 1.0  # idle time before each timed fit
REGIMES = {"well": 0, "today": 16}  # regime -> rank of the hidden states' shared structure
BASELINES = ("torch adam", "scipy L-BFGS-B f64", "scipy L-BFGS-B f32")
METHODS = (*BASELINES, "cb_core subspace", "cb_core newton", "cb_core lbfgs", "cb_core adam")
CLI_TARGET_S = 2.0  # a warm one-off `cb-agent fit`, start to saved concept, at most
TARGET = 1.5  # the fastest baseline's time to the gap over the default solver's whole fit, at least


# ----------------------------------------------------------------------------------- one problem
def reference_optimum(npz, model):
    import jax
    import jax.numpy as jnp

    import cb_core

    dec = cb_core.load_decisions(npz)
    with jax.enable_x64(True):
        ref = cb_core.fit(dec, cb_core.Newton(tol=1e-10), dtype=jnp.float64, certify="structural")
    f_star = float(objectives(model, ref.alpha[None])[0])
    return f_star, ref


def judge(out, model, f_star):
    """Gaps of the recorded iterates; the earliest time stamp of one within GAP (None if never)."""
    gaps = objectives(model, out["trace"]) - f_star
    hit = np.flatnonzero(gaps <= GAP)
    return dict(seconds=out["seconds"], iters=out["iters"], passes=out["passes"],
                final_gap=float(gaps[-1]),
                to_gap=float(out["stamps"][hit].min()) if hit.size else None,
                min_gap=float(gaps.min()))


def run_problem(workers, n, d, regime, rounds, seed, tmp):
    from cb_core.decision_file import write_decisions
    from cb_core.synthetic import synthetic_decisions

    dec = synthetic_decisions(n, d, seed=seed, rank=REGIMES[regime])
    npz = os.path.join(tmp, f"d{n}x{d}-{regime}.npz")
    with open(npz, "wb") as f:
        write_decisions(f, dec)
    model = float64_model(load_npz(npz))
    f_star, ref = reference_optimum(npz, model)
    print(f"\n=== N = {n}, d = {d}, regime {regime} (rank {REGIMES[regime]}), T = {dec.n_rows} "
          f"rows; float64 optimum f* = {f_star:.12f} ({ref.n_iter} Newton steps, "
          f"|g| {ref.grad_norm:.1e}) ===", flush=True)
    for w in workers:
        w.problem(npz)
        w.run()  # warm-up (compiles the cb_core programs)
    results = {w.method: [] for w in workers}
    for r in range(rounds):
        for w in rotated(workers, r):
            time.sleep(PAUSE_S)  # the last worker's thread pools (OpenBLAS, XLA) stop spinning first
            results[w.method].append(judge(w.run(), model, f_star))
    table = {}
    for m, runs in results.items():
        to_gap = [x["to_gap"] for x in runs]
        table[m] = dict(seconds=statistics.median(x["seconds"] for x in runs),
                        iters=int(statistics.median(x["iters"] for x in runs)),
                        passes=(None if None in [x["passes"] for x in runs]
                                else int(statistics.median(x["passes"] for x in runs))),
                        final_gap=statistics.median(x["final_gap"] for x in runs),
                        to_gap=statistics.median(to_gap) if None not in to_gap else None,
                        rounds=len(runs))
    print(f"{'method':<22}{'own stop (s)':>13}{'iters':>7}{'passes':>8}{'gap at stop':>13}"
          f"{'to gap<=1e-6 (s)':>18}")
    for m, r in table.items():
        to_gap = f"{r['to_gap']:.3f}" if r["to_gap"] is not None else "not reached"
        passes = "-" if r["passes"] is None else str(r["passes"])
        print(f"{m:<22}{r['seconds']:>13.3f}{r['iters']:>7d}{passes:>8}{r['final_gap']:>13.2e}"
              f"{to_gap:>18}")
    return dict(n=n, d=d, regime=regime, t=dec.n_rows, f_star=f_star, rows=table)


# ----------------------------------------------------------------------------------- one-off CLI
def cli_timing(n, d, seed, rounds, tmp):
    from cb_core.decision_file import write_decisions
    from cb_core.synthetic import synthetic_decisions

    npz = os.path.join(tmp, f"cli{n}x{d}.npz")
    with open(npz, "wb") as f:
        write_decisions(f, synthetic_decisions(n, d, seed=seed))
    env = dict(os.environ, CB_AGENT_CACHE=os.path.join(tmp, f"cache{n}x{d}"))
    exe = os.path.join(os.path.dirname(sys.executable), "cb-agent")
    cmd = [exe, "fit", npz, "--out", os.path.join(tmp, "c.safetensors"), "--json"]

    def once():
        t = time.perf_counter()
        res = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
        wall = time.perf_counter() - t
        out = json.loads(res.stdout.strip().splitlines()[-1])
        return dict(wall=wall, **out.get("timings", {}), converged=out["converged"])

    cold = once()
    warm = [once() for _ in range(rounds)]
    keys = [k for k in warm[0] if k not in ("converged",)]
    med = {k: statistics.median(w[k] for w in warm) for k in keys}
    print(f"cb-agent fit N = {n}, d = {d}: cold cache {cold['wall']:.2f} s, warm "
          f"{med['wall']:.2f} s (median of {rounds}; converged {warm[0]['converged']}); warm "
          "breakdown: " + ", ".join(f"{k} {v:.2f}" for k, v in med.items() if k != "wall"),
          flush=True)
    v = verdict(f"warm one-off cb-agent fit N = {n}, d = {d} (s)", med["wall"], CLI_TARGET_S, at_most=True)
    print(verdict_line(v), flush=True)
    return dict(n=n, d=d, cold=cold, warm_median=med, verdict=v)


# ----------------------------------------------------------------------------------- six concepts
SIX_SIZES = (14, 20, 26, 11, 17, 23)  # decisions per task type, two demonstrations each


def six_concepts_main(cache: str, d: int) -> None:
    """Fit six per-type concepts (d = 576 by default) in this process; print the fits' times."""
    import cb_core
    from cb_core.cache import enable_persistent_cache
    from cb_io.storage import write_bytes_atomic
    from cb_core.synthetic import synthetic_decisions

    t0 = time.perf_counter()
    if cache:
        enable_persistent_cache(cache, write_bytes_atomic)
    decs = [synthetic_decisions(n, d, m_mean=22, m_spread=14, seed=k, min_m=2)
            for k, n in enumerate(SIX_SIZES)]
    t1 = time.perf_counter()
    results = [cb_core.fit(dec) for dec in decs]
    t2 = time.perf_counter()
    warm = []
    for _ in range(3):
        t = time.perf_counter()
        [cb_core.fit(dec) for dec in decs]
        warm.append(time.perf_counter() - t)
    print(json.dumps(dict(first=t2 - t1, warm=statistics.median(warm), setup=t1 - t0,
                          converged=all(r.converged for r in results))))


def six_concepts_timing(tmp, d):
    cache = os.path.join(tmp, "six-cache")
    cmd = [sys.executable, __file__, "--six-concepts", cache, str(d)]
    runs = [json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True)
                       .stdout.strip().splitlines()[-1]) for _ in range(3)]
    first, again = runs[0], runs[1:]
    out = dict(compile_s=first["first"], new_process_s=statistics.median(r["first"] for r in again),
               warm_s=statistics.median(r["warm"] for r in runs), converged=first["converged"])
    print(f"six per-type concepts (d = {d}, N = {', '.join(map(str, SIX_SIZES))}): "
          f"first process {out['compile_s']:.2f} s (compiles), a new process with the stored "
          f"executables {out['new_process_s']:.2f} s, warm in-process {out['warm_s']:.3f} s",
          flush=True)
    return out


# ----------------------------------------------------------------------------------- many concepts
MANY_TASK_TYPES, MANY_STRENGTHS, MANY_FOLDS = 6, 10, 5
MANY_TARGET = 3.0  # the faster sequential baseline over the batched fit, at least
MANY_METHODS = ("batched cb_core", "sequential cb_core", "sequential cb_core warm", "sequential scipy f32",
                "sequential scipy f32 warm")


def many_concepts(n: int, d: int, rounds: int, task_types: int = MANY_TASK_TYPES, strengths: int = MANY_STRENGTHS,
                  folds: int = MANY_FOLDS, seed: int = 0) -> dict:
    """Task types x strengths x folds fits (each fold leaves 1/folds of a type's N decisions out)
    in this process, five ways side by side: one :func:`cb_core.fit_many` call per task type (its
    strengths x folds problems share one read of its hidden states per pass); as
    many sequential :func:`cb_core.fit` calls (Newton-CG); as many sequential scipy L-BFGS-B float32
    fits (``_fit_workers.scipy_objective``, features computed untimed); and both sequential ways
    warm-started along each fold's strength path (strongest first, each fit from the previous
    strength's alpha). Every fit stops at ||grad|| <= 1e-3 (the certified gap ||g||^2 / (2 lam) alike).
    Each round runs the methods in rotated order (:func:`_targets.rotated`); ratios are medians of
    the rounds' paired ratios, unrounded."""
    import jax

    import cb_core
    from _fit_workers import scipy_fit, scipy_objective
    from _targets import median_ratio
    from cb_core.synthetic import synthetic_decisions

    tol = 1e-3
    lams = np.geomspace(10.0, 0.03, strengths)  # the path: strongest first
    types = [synthetic_decisions(n, d, seed=seed + t) for t in range(task_types)]
    masks = np.ones((folds, n))
    for f in range(folds):
        masks[f, f::folds] = 0.0  # fold f leaves every folds-th decision out
    kept = [np.flatnonzero(m) for m in masks]

    def subset(dec, keep):
        offsets = np.asarray(dec.offsets)
        rows = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in keep])
        sizes = np.diff(offsets)[keep]
        return cb_core.LabelledDecisions(np.asarray(dec.hidden)[rows], np.asarray(dec.log_q)[rows],
                                         np.asarray(dec.n_tokens)[rows], np.concatenate([[0], np.cumsum(sizes)]),
                                         np.repeat(np.arange(keep.size), sizes), np.asarray(dec.expert)[keep])

    subsets = [[subset(dec, keep) for keep in kept] for dec in types]
    objectives_f32 = [[scipy_objective({k: np.asarray(getattr(sub, k)) for k in
                                        ("hidden", "log_q", "n_tokens", "offsets", "expert")}, np.float32)
                       for sub in row] for row in subsets]
    lam_k = np.tile(lams, folds)  # problem k: strength k % strengths, fold k // strengths
    weights = np.repeat(masks, strengths, axis=0)

    def batched():  # one call per task type: its strengths x folds problems share its hidden states
        return [r.converged for dec in types
                for r in cb_core.fit_many(dec, lam=lam_k, weights=weights, certify="structural")[0]]

    def sequential_cb_core(warm):
        def run():
            out = []
            for row in subsets:
                for sub in row:
                    alpha = None
                    for lam in lams:
                        r = cb_core.fit(sub, lam=float(lam), certify="structural", init=alpha if warm else None)
                        alpha = r.alpha
                        out.append(r.converged)
            return out
        return run

    def sequential_scipy(warm):
        def run():
            out = []
            for row in objectives_f32:
                for fg in row:
                    alpha = None
                    for lam in lams:
                        alpha, converged, _ = scipy_fit(fg, float(lam), tol, alpha if warm else None)
                        out.append(converged)
            return out
        return run

    methods = dict(zip(MANY_METHODS, (batched, sequential_cb_core(False), sequential_cb_core(True),
                                      sequential_scipy(False), sequential_scipy(True))))
    for run in methods.values():
        run()  # warm-up: compiles the cb_core programs
    seconds = {m: [] for m in methods}
    converged = {}
    for r in range(rounds):
        for m in rotated(list(methods), r):
            time.sleep(PAUSE_S)
            t0 = time.perf_counter()
            flags = methods[m]()
            seconds[m].append(time.perf_counter() - t0)
            converged[m] = int(sum(flags))
    fits = task_types * strengths * folds
    ratios = {m: median_ratio(seconds[m], seconds["batched cb_core"]) for m in methods if m != "batched cb_core"}
    rows = {m: dict(seconds=statistics.median(seconds[m]), rounds_s=seconds[m], converged=converged[m], fits=fits,
                    over_batched=ratios.get(m)) for m in methods}
    faster = min(ratios, key=ratios.get)
    v = verdict(f"many concepts N = {n}, d = {d}: {faster} (faster sequential baseline) / batched cb_core",
                ratios[faster], MANY_TARGET, at_most=False)
    print(f"\nmany concepts: {task_types} task types x {strengths} strengths x {folds} folds = {fits} fits, "
          f"N = {n}, d = {d}, stop ||grad|| <= {tol:g}; jax on {jax.devices()[0].platform}; median of {rounds} rounds")
    print(f"{'method':<28}{'seconds':>12}{'converged':>11}{'over batched':>22}")
    for m, row in rows.items():
        ratio = "" if row["over_batched"] is None else repr(row["over_batched"])
        print(f"{m:<28}{row['seconds']:>12.3f}{row['converged']:>7d}/{fits:<3d}{ratio:>22}")
    print(verdict_line(v), flush=True)
    return dict(n=n, d=d, task_types=task_types, strengths=strengths, folds=folds, lams=lams.tolist(), tol=tol,
                rounds=rounds, rows=rows, verdict=v, machine=machine())


def many_concepts_timing(n: int, d: int, rounds: int, threads: int | None, tiny: bool) -> dict:
    """:func:`many_concepts` in a worker process pinned to ``threads`` threads alike for every
    method (``_fit_workers.pinned_env``: numpy's BLAS and XLA's CPU client)."""
    from _fit_workers import pinned_env

    cmd = [sys.executable, __file__, "--many-worker", str(n), str(d), str(rounds)] + (["--tiny"] if tiny else [])
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=pinned_env(threads))
    lines = out.stdout.strip().splitlines()
    print("\n".join(lines[:-1]), flush=True)
    return json.loads(lines[-1])


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="50x2560,125x5120")
    ap.add_argument("--regimes", default="well,today")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of: " + ", ".join(METHODS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="threads of every method alike: numpy's BLAS, XLA, torch (default 1; 0: each "
                         "library's own default, every CPU)")
    ap.add_argument("--no-cli", action="store_true", help="skip the one-off process timings")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    ap.add_argument("--tiny", action="store_true",
                    help="smoke test of every path on N = 12, d = 16, one round (no measurement)")
    ap.add_argument("--only-many", action="store_true",
                    help=f"only the many-concepts row ({MANY_TASK_TYPES} task types x {MANY_STRENGTHS} strengths x "
                         f"{MANY_FOLDS} folds: one fit_many call against sequential fits)")
    ap.add_argument("--many-n", type=int, default=50, help="decisions per task type of the many-concepts row (50 or 125)")
    ap.add_argument("--many-d", type=int, default=2560, help="hidden width of the many-concepts row")
    ap.add_argument("--six-concepts", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--many-worker", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.tiny:
        args.sizes, args.rounds, args.many_n, args.many_d = "12x16", 1, 10, 16
    if args.six_concepts is not None:
        six_concepts_main(args.six_concepts[0], int(args.six_concepts[1]))
        return
    if args.many_worker is not None:
        n, d, rounds = args.many_worker
        kw = dict(task_types=2, strengths=3, folds=2) if args.tiny else {}
        print(json.dumps(many_concepts(n, d, rounds, seed=args.seed, **kw)))
        return
    if args.only_many:
        results = dict(many_concepts=many_concepts_timing(args.many_n, args.many_d, args.rounds, args.threads or None,
                                                          args.tiny))
        if args.json:
            with open(args.json + ".tmp", "w") as f:
                json.dump(results, f, indent=1)
            os.replace(args.json + ".tmp", args.json)
        return
    import jax
    import torch

    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs; float32 fits judged in float64; rounds {args.rounds}")
    results = dict(problems=[], cli=[], six_concepts=None)
    with tempfile.TemporaryDirectory() as tmp:
        sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
        methods = args.methods.split(",")
        unknown = sorted(set(methods) - set(METHODS))
        if unknown:
            raise SystemExit(f"--methods: unknown {unknown}; choose from {list(METHODS)}")
        print(f"threads per method: {args.threads or 'library defaults'}; load average before "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        results["threads"], results["load_before"] = args.threads or None, os.getloadavg()
        workers = [Worker(m, tmp, args.threads or None) for m in methods]
        try:
            for n, d in sizes:
                for regime in args.regimes.split(","):
                    results["problems"].append(run_problem(workers, n, d, regime, args.rounds,
                                                           args.seed, tmp))
        finally:
            for w in workers:
                w.close()
        results["verdicts"] = headline(results["problems"])
        results["machine"] = machine()
        results["load_after"] = os.getloadavg()
        if not args.no_cli:
            print("\none-off process, start to saved concept (`cb-agent fit`, regime today):")
            for n, d in sizes:
                results["cli"].append(cli_timing(n, d, args.seed, args.rounds, tmp))
            results["six_concepts"] = six_concepts_timing(tmp, 16 if args.tiny else 576)
        results["many_concepts"] = many_concepts_timing(args.many_n, args.many_d, args.rounds, args.threads or None,
                                                        args.tiny)
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(args.json + ".tmp", args.json)


def headline(problems) -> list[dict]:
    """Per problem: the fastest baseline's time to the gap over the default solver's whole fit
    (to its own stop, when its gap there is <= GAP), compared unrounded with :data:`TARGET`."""
    import importlib

    default = f"cb_core {importlib.import_module('cb_core.fit').DEFAULT_SOLVER.name}"
    print(f"\nheadline: fastest baseline's time to gap <= {GAP:g} over the default solver's ({default}) "
          "whole fit to its own stop (median of rounds):")
    verdicts = []
    for p in problems:
        where = f"N = {p['n']}, d = {p['d']}, {p['regime']}"
        if default not in p["rows"]:
            print(f"  {where}: no ratio ({default} not run)")
            continue
        ours = p["rows"][default]
        reached = {b: r["to_gap"] for b, r in p["rows"].items() if b in BASELINES and r["to_gap"] is not None}
        for base, b in reached.items():
            print(f"  {where}: {base} / {default} = {b / ours['seconds']!r}")
        if not reached or ours["final_gap"] > GAP:
            print(f"  {where}: no ratio (baselines reaching the gap: {sorted(reached) or 'none'}; "
                  f"{default}'s gap at its stop {ours['final_gap']:.2e})")
            continue
        fastest = min(reached, key=reached.get)
        v = verdict(f"{where}: {fastest} (fastest baseline) / {default}", reached[fastest] / ours["seconds"],
                    TARGET, at_most=False)
        print("  " + verdict_line(v))
        verdicts.append(v)
    return verdicts


if __name__ == "__main__":
    main()
