"""Fit speed: time to a common objective gap against honest baselines, the one-off CLI fit, and
the six per-type concepts fitted at the start of ``cb-agent run``.

Data: :func:`cb_core.synthetic.synthetic_decisions` (about 25 candidates a decision), float32, at
N = 50, d = 2560 (Qwen3-4B width) and N = 125, d = 5120 (14B width), in two regimes:

* ``well``: hidden states without low-rank structure (``rank=0``): well conditioned, the seed's
  Adam converges (||grad|| < 1e-4) in a few hundred steps;
* ``today``: correlated hidden states (``rank=16``, the data of the earlier benchmark): ill
  conditioned; Adam stops at its 1,500-step cap without converging.

Methods, each in its own worker process (no thread pool shared between them, and one second
idle before each timed fit, so the thread pools of the fit before, e.g. OpenBLAS's, have stopped
spinning), warmed up once (compiling the cb_core programs), then ``--rounds`` rounds in rotating
order; every figure is the median over rounds:

* ``torch adam``: the seed protocol in PyTorch (float32), vectorised over the padded
  [N, M_max, m] layout with features and prior computed *before* the timed loop: Adam lr 0.01
  from alpha = 0, stop at ||grad|| < 1e-4 or 1,500 steps; with the faster of 1 and all threads.
* ``scipy L-BFGS-B f64``: numpy float64 objective and gradient, features computed before the
  timed call; scipy's own stop (gtol 1e-5).
* ``cb_core subspace`` / ``newton`` / ``lbfgs`` / ``adam``: :func:`cb_core.fit` in float32,
  timed whole (validation, padding, features, solve; compiled at the warm-up), each with its own
  stop.

The ``passes`` column counts reads of the feature (or hidden-state) matrix: the fits are
memory-bound, so it is the cost that does not depend on the machine's load (torch: two per
Adam step; scipy: two per function evaluation; cb_core: ``FitResult.n_passes``, the features'
statistics included, host-side validation and padding not; lbfgs: not counted).

Gap: every alpha is judged by one float64 numpy objective (written here from the seed's
equations) against f*, the optimum of a float64 cb_core Newton fit to ||grad|| <= 1e-10.
*Time to gap <= 1e-6*: for the baselines the first recorded iterate within it (iterates and
timestamps are recorded inside the timed loop and judged afterwards: generous, since their own
stopping rules do not know f*); for cb_core the time to its own stop, when the gap there is
<= 1e-6 (the certificate ||g||^2 / (2 lam) bounds it by 5e-7 with the default tolerance).
Ratios say which baseline they use. XLA uses every CPU.

Then the one-off process (``cb-agent fit`` from process start to saved concept, a cold and a
warm cache, with the command's own breakdown) and the six per-type concepts (d = 576, shapes of
``cb-agent run``'s demonstrations) fitted warm in one process and in a new process that loads
the stored executables.

Run:   .venv/bin/python benchmarks/fit_speed.py [--sizes 50x2560,125x5120] [--regimes well,today]
                                                [--rounds 3] [--no-cli] [--json OUT] [--tiny]
(``--tiny``: every path once on N = 12, d = 16: a smoke test, not a measurement.)
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

import numpy as np

SEED_LR, SEED_STEPS, SEED_TOL = 0.01, 1500, 1e-4
GAP = 1e-6
PAUSE_S = 1.0  # idle time before each timed fit
REGIMES = {"well": 0, "today": 16}  # regime -> rank of the hidden states' shared structure
METHODS = ("torch adam", "scipy L-BFGS-B f64", "cb_core subspace", "cb_core newton",
           "cb_core lbfgs", "cb_core adam")


# ----------------------------------------------------------------------------------- the judge
def load_npz(path):
    with np.load(path) as z:
        return {k: z[k] for k in ("hidden", "log_q", "n_tokens", "offsets", "expert")}


def float64_model(arrays, gamma=0.8, eps=1e-6):
    """(phi [T, m], log Qbar [T], offsets, expert rows) in float64 numpy (seed App. B, Eq. 3)."""
    offsets = arrays["offsets"]
    h = arrays["hidden"].astype(np.float64)
    sizes = np.diff(offsets).astype(np.float64)
    seg = np.repeat(np.arange(sizes.size), np.diff(offsets))
    mean = np.add.reduceat(h, offsets[:-1]) / sizes[:, None]
    cen = h - mean[seg]
    std = np.sqrt(np.add.reduceat(cen**2, offsets[:-1]) / sizes[:, None])
    phi = np.concatenate([cen / np.maximum(std, eps)[seg], (sizes ** -0.5)[seg][:, None]], 1)
    lq = arrays["log_q"].astype(np.float64) / arrays["n_tokens"].astype(np.float64) ** gamma
    mx = np.maximum.reduceat(lq, offsets[:-1])
    lq = lq - (np.log(np.add.reduceat(np.exp(lq - mx[seg]), offsets[:-1])) + mx)[seg]
    return phi, lq, offsets, offsets[:-1] + arrays["expert"]


def objectives(model, alphas, lam=1.0):
    """Eq. 6 in float64 at each row of alphas [K, m] (one pass over phi for all K)."""
    phi, lq, offsets, rows = model
    seg = np.repeat(np.arange(offsets.size - 1), np.diff(offsets))
    s = lq[:, None] + phi @ np.asarray(alphas, np.float64).T  # [T, K]
    mx = np.maximum.reduceat(s, offsets[:-1])
    lse = np.log(np.add.reduceat(np.exp(s - mx[seg]), offsets[:-1])) + mx
    a = np.asarray(alphas, np.float64)
    return np.mean(lse - s[rows], axis=0) + 0.5 * lam * np.sum(a * a, axis=1)


# ----------------------------------------------------------------------------------- workers
def torch_worker(arrays, lam=1.0, gamma=0.8, eps=1e-6):
    """The seed protocol in PyTorch; features and prior precomputed (untimed)."""
    import torch

    offsets = arrays["offsets"]
    sizes = np.diff(offsets)
    n, m_max, d = len(sizes), int(sizes.max()), arrays["hidden"].shape[1]
    seg = np.repeat(np.arange(n), sizes)
    local = np.arange(len(seg)) - offsets[seg]
    h = torch.zeros(n, m_max, d)
    h[seg, local] = torch.from_numpy(arrays["hidden"])
    mask = torch.zeros(n, m_max, dtype=torch.bool)
    mask[seg, local] = True
    w = mask.float().unsqueeze(-1)
    cnt = w.sum(1, keepdim=True)
    mean = (h * w).sum(1, keepdim=True) / cnt
    cen = (h - mean) * w
    std = ((cen**2).sum(1, keepdim=True) / cnt).sqrt().clamp_min(eps)
    phi = torch.cat([cen / std, (cnt.squeeze(-1) ** -0.5).expand(n, m_max).unsqueeze(-1) * w], -1)
    del h, cen
    lq = torch.full((n, m_max), -float("inf"))
    lq[seg, local] = torch.from_numpy(arrays["log_q"] / arrays["n_tokens"].astype(np.float32) ** gamma)
    prior = torch.log_softmax(lq, -1)
    ex = torch.from_numpy(arrays["expert"].astype(np.int64))
    phi = phi.reshape(n * m_max, d + 1).contiguous()  # one [N M, m] matrix: s is one mv

    def loss_of(alpha):
        s = (prior + (phi @ alpha).view(n, m_max)).masked_fill(~mask, -float("inf"))
        return -torch.log_softmax(s, -1).gather(1, ex[:, None]).mean() + 0.5 * lam * alpha.dot(alpha)

    def step_seconds(threads):
        torch.set_num_threads(threads)
        alpha = torch.zeros(d + 1, requires_grad=True)
        loss_of(alpha).backward()
        t = time.perf_counter()
        for _ in range(10):
            alpha.grad = None
            loss_of(alpha).backward()
        return (time.perf_counter() - t) / 10

    # OpenMP with every core can be several times slower than one thread on a shared machine:
    # the baseline gets whichever thread count is faster here
    threads = min(range(1, (os.cpu_count() or 1) + 1), key=step_seconds)
    torch.set_num_threads(threads)
    print(f"torch threads {threads}", file=sys.stderr, flush=True)

    def run():
        trace = torch.empty(SEED_STEPS + 1, d + 1)
        stamps = np.empty(SEED_STEPS + 1)
        t0 = time.perf_counter()
        alpha = torch.zeros(d + 1, requires_grad=True)
        opt = torch.optim.Adam([alpha], lr=SEED_LR)
        for step in range(SEED_STEPS + 1):
            opt.zero_grad()
            loss_of(alpha).backward()
            with torch.no_grad():
                trace[step] = alpha
            stamps[step] = time.perf_counter() - t0
            if alpha.grad.norm() < SEED_TOL or step == SEED_STEPS:
                break
            opt.step()
        seconds = time.perf_counter() - t0
        # passes over phi: a forward (phi alpha) and a backward (phi^T r) per evaluation
        return seconds, step, trace[: step + 1].numpy().copy(), stamps[: step + 1], 2 * (step + 1)

    return run


def scipy_worker(arrays, lam=1.0):
    """scipy L-BFGS-B on a numpy float64 objective; features precomputed (untimed)."""
    import scipy.optimize

    phi, lq, offsets, rows = float64_model(arrays)
    seg = np.repeat(np.arange(offsets.size - 1), np.diff(offsets))
    n = offsets.size - 1

    def fg(a):
        s = lq + phi @ a
        mx = np.maximum.reduceat(s, offsets[:-1])
        e = np.exp(s - mx[seg])
        z = np.add.reduceat(e, offsets[:-1])
        f = np.sum(np.log(z) + mx - s[rows]) / n + 0.5 * lam * a @ a
        r = e / z[seg]
        r[rows] -= 1.0
        return f, r @ phi / n + lam * a

    def run():
        trace, stamps = [np.zeros(phi.shape[1])], [0.0]
        t0 = time.perf_counter()

        def record(x):
            stamps.append(time.perf_counter() - t0)
            trace.append(np.array(x))

        res = scipy.optimize.minimize(fg, np.zeros(phi.shape[1]), jac=True, method="L-BFGS-B",
                                      options=dict(gtol=1e-5, maxiter=1000), callback=record)
        seconds = time.perf_counter() - t0
        return seconds, int(res.nit), np.asarray(trace), np.asarray(stamps), 2 * int(res.nfev)

    return run


def cb_core_worker(npz, method):
    import cb_core

    dec = cb_core.load_decisions(npz)
    solver = {"subspace": cb_core.Subspace, "newton": cb_core.Newton, "lbfgs": cb_core.LBFGS,
              "adam": cb_core.Adam}[method]()

    def run():
        t0 = time.perf_counter()
        r = cb_core.fit(dec, solver, certify="structural")
        seconds = time.perf_counter() - t0
        return (seconds, r.n_iter, r.alpha[None].astype(np.float64), np.array([seconds]),
                r.n_passes)

    return run


def worker_main(method: str, out_dir: str) -> None:
    """A worker process for one method: per line read from stdin, ``problem NPZ`` prepares a
    problem (untimed) and ``run`` times one fit of it; answers one line each."""
    run = None
    for k, line in enumerate(sys.stdin):
        command, _, arg = line.strip().partition(" ")
        if command == "problem":
            run = None  # free the last problem's arrays first
            if method == "torch adam":
                run = torch_worker(load_npz(arg))
            elif method == "scipy L-BFGS-B f64":
                run = scipy_worker(load_npz(arg))
            else:
                run = cb_core_worker(arg, method.split()[-1])
            print("ready", flush=True)
            continue
        seconds, iters, trace, stamps, passes = run()
        path = os.path.join(out_dir, f"{method.replace(' ', '_')}-{k}.npz")
        np.savez(path, trace=trace, stamps=stamps)
        print(json.dumps(dict(seconds=seconds, iters=int(iters), passes=passes, path=path)),
              flush=True)


class Worker:
    """One method's worker process, kept for every problem (one import of torch or JAX)."""

    def __init__(self, method, out_dir):
        self.method = method
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", method, out_dir],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def _ask(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"worker {self.method} died (exit code {self.proc.wait()})")
        return answer.strip()

    def problem(self, npz):
        if self._ask(f"problem {npz}") != "ready":
            raise RuntimeError(f"worker {self.method} could not prepare {npz}")

    def run(self):
        out = json.loads(self._ask("run"))
        with np.load(out["path"]) as z:
            out["trace"], out["stamps"] = z["trace"], z["stamps"]
        os.unlink(out["path"])
        return out

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


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
    """Gaps of the recorded iterates; time to the first within GAP (None if never)."""
    gaps = objectives(model, out["trace"]) - f_star
    hit = np.flatnonzero(gaps <= GAP)
    return dict(seconds=out["seconds"], iters=out["iters"], passes=out["passes"],
                final_gap=float(gaps[-1]),
                to_gap=float(out["stamps"][hit[0]]) if hit.size else None,
                min_gap=float(gaps.min()))


def run_problem(workers, n, d, regime, rounds, seed, tmp):
    from cb_core.decisions import save_decisions
    from cb_core.synthetic import synthetic_decisions

    dec = synthetic_decisions(n, d, seed=seed, rank=REGIMES[regime])
    npz = os.path.join(tmp, f"d{n}x{d}-{regime}.npz")
    save_decisions(npz, dec)
    model = float64_model(load_npz(npz))
    f_star, ref = reference_optimum(npz, model)
    print(f"\n=== N = {n}, d = {d}, regime {regime} (rank {REGIMES[regime]}), T = {dec.n_rows} "
          f"rows; float64 optimum f* = {f_star:.12f} ({ref.n_iter} Newton steps, "
          f"|g| {ref.grad_norm:.1e}) ===", flush=True)
    for w in workers:
        w.problem(npz)
        w.run()  # warm-up (compiles the cb_core programs)
    results = {m: [] for m in METHODS}
    for r in range(rounds):
        order = workers[r % len(workers):] + workers[: r % len(workers)]
        for w in order:
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
    from cb_core.decisions import save_decisions
    from cb_core.synthetic import synthetic_decisions

    npz = os.path.join(tmp, f"cli{n}x{d}.npz")
    save_decisions(npz, synthetic_decisions(n, d, seed=seed))
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
    return dict(n=n, d=d, cold=cold, warm_median=med)


# ----------------------------------------------------------------------------------- six concepts
SIX_SIZES = (14, 20, 26, 11, 17, 23)  # decisions per task type, two demonstrations each


def six_concepts_main(cache: str, d: int) -> None:
    """Fit six per-type concepts (d = 576 by default) in this process; print the fits' times."""
    import cb_core
    from cb_core.cache import enable_persistent_cache
    from cb_core.synthetic import synthetic_decisions

    t0 = time.perf_counter()
    if cache:
        enable_persistent_cache(cache)
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


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="50x2560,125x5120")
    ap.add_argument("--regimes", default="well,today")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-cli", action="store_true", help="skip the one-off process timings")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    ap.add_argument("--tiny", action="store_true",
                    help="smoke test of every path on N = 12, d = 16, one round (no measurement)")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--six-concepts", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.tiny:
        args.sizes, args.rounds = "12x16", 1
    if args.worker:
        worker_main(*args.worker)
        return
    if args.six_concepts is not None:
        six_concepts_main(args.six_concepts[0], int(args.six_concepts[1]))
        return
    import jax
    import torch

    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs; float32 fits judged in float64; rounds {args.rounds}")
    results = dict(problems=[], cli=[], six_concepts=None)
    with tempfile.TemporaryDirectory() as tmp:
        sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
        workers = [Worker(m, tmp) for m in METHODS]
        try:
            for n, d in sizes:
                for regime in args.regimes.split(","):
                    results["problems"].append(run_problem(workers, n, d, regime, args.rounds,
                                                           args.seed, tmp))
        finally:
            for w in workers:
                w.close()
        headline(results["problems"])
        if not args.no_cli:
            print("\none-off process, start to saved concept (`cb-agent fit`, regime today):")
            for n, d in sizes:
                results["cli"].append(cli_timing(n, d, args.seed, args.rounds, tmp))
            results["six_concepts"] = six_concepts_timing(tmp, 16 if args.tiny else 576)
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(args.json + ".tmp", args.json)


def headline(problems):
    import importlib

    default = f"cb_core {importlib.import_module('cb_core.fit').DEFAULT_SOLVER.name}"
    print(f"\nheadline: time to gap <= 1e-6 of the default solver ({default}) against each "
          "baseline (baseline / default; 'not reached' when the baseline never got there):")
    for p in problems:
        ours = p["rows"][default]["to_gap"]
        parts = []
        for base in ("torch adam", "scipy L-BFGS-B f64"):
            b = p["rows"][base]["to_gap"]
            parts.append(f"{base}: " + ("not reached" if b is None or ours is None
                                        else f"{b / ours:.1f}x"))
        print(f"  N = {p['n']}, d = {p['d']}, {p['regime']}: " + "; ".join(parts))


if __name__ == "__main__":
    main()
