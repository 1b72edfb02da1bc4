"""The worker processes of ``fit_speed.py``: the float64 judge's model and one timed fit per method.

:class:`Worker` starts ``python _fit_workers.py METHOD OUT_DIR`` (:func:`worker_main`) and keeps it
for every problem (one import of torch or JAX per method). The methods and their timing rules are
described in ``fit_speed.py``. Not a benchmark itself (no ``main``).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import time
import types

import numpy as np

import _targets

SEED_LR, SEED_STEPS, SEED_TOL = 0.01, 1500, 1e-4
#: Set by :class:`Worker` to the thread count every method is pinned to (numpy's BLAS, XLA, torch).
THREADS_ENV = "CB_FIT_SPEED_THREADS"


def pinned_env(threads: int | None) -> dict[str, str]:
    """The environment of a worker whose numerics run on ``threads`` threads, alike for every
    method (:func:`_targets.pinned_env`), with :data:`THREADS_ENV` telling the worker the count;
    None: the libraries' own defaults (every CPU)."""
    env = _targets.pinned_env(threads)
    if threads is None:
        env.pop(THREADS_ENV, None)
    else:
        env[THREADS_ENV] = str(threads)
    return env


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

    evaluations = [0]  # counted: each evaluation reads phi twice (phi alpha, then phi^T r in backward)

    def loss_of(alpha):
        evaluations[0] += 1
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
    pinned = os.environ.get(THREADS_ENV)
    threads = int(pinned) if pinned else min(range(1, (os.cpu_count() or 1) + 1), key=step_seconds)
    torch.set_num_threads(threads)
    print(f"torch threads {threads}", file=sys.stderr, flush=True)

    def run():
        trace = torch.empty(SEED_STEPS + 1, d + 1)
        stamps = np.empty(SEED_STEPS + 1)
        evaluations[0] = 0
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
        return seconds, step, trace[: step + 1].numpy().copy(), stamps[: step + 1], 2 * evaluations[0]

    return run


def scipy_objective(arrays, dtype):
    """``fg(a, lam) -> (Eq. 6, its gradient)``, the numpy objective of the scipy baselines, in ``dtype``
    (float64 or float32: a memory-bound fit reads half the bytes in float32); features precomputed
    here (untimed). One evaluation is one vectorised pass each way over phi (``phi @ a``, then
    ``r @ phi``: BLAS matrix-vector products on the packed [T, m] matrix) and per-set reductions of
    length T, in ``dtype`` throughout (only the m-vector alpha and its gradient cross to float64 for
    scipy). ``fg.evaluations`` counts the calls (each reads phi twice)."""
    phi, lq, offsets, rows = float64_model(arrays)
    phi, lq = np.ascontiguousarray(phi, dtype), lq.astype(dtype)
    starts, sizes = offsets[:-1], np.diff(offsets)
    n = offsets.size - 1

    def fg(a, lam):
        fg.evaluations += 1
        a32 = a.astype(dtype)
        s = phi @ a32
        s += lq
        chosen = s[rows]
        mx = np.maximum.reduceat(s, starts)
        s -= np.repeat(mx, sizes)
        e = np.exp(s, out=s)
        z = np.add.reduceat(e, starts)
        # the N-length sums in float64: float32 rounding there would stall the line search short of
        # the gap (the T x m passes, the memory-bound part, stay in ``dtype``)
        f = (np.sum(np.log(z), dtype=np.float64) + np.sum(mx, dtype=np.float64)
             - np.sum(chosen, dtype=np.float64)) / n + 0.5 * lam * float(a @ a)
        e /= np.repeat(z, sizes)
        e[rows] -= 1.0
        g = e @ phi
        g /= n
        g += lam * a32
        return float(f), g.astype(np.float64)

    fg.evaluations, fg.size = 0, phi.shape[1]
    return fg


def scipy_fit(fg, lam, tol, x0=None):
    """scipy L-BFGS-B on ``fg`` (:func:`scipy_objective`) from ``x0`` (None: alpha = 0), stopped
    once the gradient's 2-norm at an iterate is <= ``tol`` (cb_core's stopping rule, so both certify
    the same objective gap ||g||^2 / (2 lam)). Returns (alpha [m], converged, iterations)."""
    import scipy.optimize

    last = {}

    def f(a):
        value, grad = fg(a, lam)
        last["norm"] = float(np.linalg.norm(grad))
        return value, grad

    def stop(_):
        if last["norm"] <= tol:
            raise StopIteration

    x0 = np.zeros(fg.size) if x0 is None else np.asarray(x0, np.float64)
    res = scipy.optimize.minimize(f, x0, jac=True, method="L-BFGS-B", callback=stop,
                                  options=dict(gtol=0.0, ftol=0.0, maxiter=1000))
    _, grad = fg(res.x, lam)
    return res.x, bool(np.linalg.norm(grad) <= tol), int(res.nit)


def scipy_worker(arrays, dtype, lam=1.0):
    """scipy L-BFGS-B on :func:`scipy_objective` in ``dtype``; scipy's own stop (gtol 1e-9)."""
    import scipy.optimize

    fg = scipy_objective(arrays, dtype)

    def run():
        trace, stamps = [np.zeros(fg.size)], [0.0]
        fg.evaluations = 0
        t0 = time.perf_counter()

        def record(x):
            stamps.append(time.perf_counter() - t0)
            trace.append(np.array(x))

        res = scipy.optimize.minimize(fg, np.zeros(fg.size), args=(lam,), jac=True, method="L-BFGS-B",
                                      options=dict(gtol=1e-9, ftol=1e-15, maxiter=1000), callback=record)
        seconds = time.perf_counter() - t0
        return seconds, int(res.nit), np.asarray(trace), np.asarray(stamps), 2 * fg.evaluations

    return run


class Probe:
    """What an instrumented cb_core fit reports back to the host while it runs: each read of the
    hidden states (a counted callback in the compiled program at every matrix-vector product
    and at the features' statistics) and each iterate with the time since :meth:`reset`."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.passes, self.trace, self.stamps, self.t0 = 0, [], [], time.perf_counter()

    def read(self, _):
        self.passes += 1

    def iterate(self, alpha):
        self.stamps.append(time.perf_counter() - self.t0)
        self.trace.append(np.asarray(alpha, np.float64))


@contextlib.contextmanager
def instrumented(probe, solve):
    """cb_core's fit with :class:`Probe` callbacks traced into ``solve`` (a separate jit of the
    fit's program, so the plain program stays uninstrumented): every ``phi_matvec`` / ``phi_rmatvec``
    and the features' statistics count a pass; each iterate (the solvers' progress update, and
    every gradient evaluation, Adam's iterates) is recorded."""
    import jax

    fit_module = importlib.import_module("cb_core.fit")
    import cb_core.model as model
    import cb_core.solvers as solvers

    def counted(f):
        def g(x, *args):
            jax.debug.callback(probe.read, x)
            return f(x, *args)
        return g

    def recorded(f):
        def g(alpha, *args):
            jax.debug.callback(probe.iterate, alpha)
            return f(alpha, *args)
        return g

    def progress(self, alpha, *args):
        jax.debug.callback(probe.iterate, alpha)
        return update(self, alpha, *args)

    def statistics(padded, *args):
        jax.debug.callback(probe.read, padded.hidden[0, 0, 0])
        return prepare(padded, *args)

    prepare, update = fit_module.prepare, solvers.Progress.update
    patches = [(model, "phi_matvec", counted(model.phi_matvec)), (model, "phi_rmatvec", counted(model.phi_rmatvec)),
               (solvers, "phi_matvec", counted(solvers.phi_matvec)),
               (solvers, "phi_rmatvec", counted(solvers.phi_rmatvec)),
               (solvers, "value_and_grad", recorded(solvers.value_and_grad)),
               (solvers.Progress, "update", progress),
               (fit_module, "prepare", statistics), (fit_module, "_solve", solve)]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def cb_core_worker(npz, method):
    """Per run: the fit timed whole (uninstrumented), then the same fit instrumented for its
    measured passes and its iterates' timestamps."""
    import jax

    import cb_core
    fit_module = importlib.import_module("cb_core.fit")

    dec = cb_core.load_decisions(npz)
    solver = {"subspace": cb_core.Subspace, "newton": cb_core.Newton, "lbfgs": cb_core.LBFGS,
              "adam": cb_core.Adam}[method]()
    probe = Probe()
    plain = fit_module._solve.__wrapped__  # a new function object: JAX caches traces by function
    solve = jax.jit(types.FunctionType(plain.__code__, plain.__globals__, plain.__name__, plain.__defaults__,
                                       plain.__closure__), static_argnums=0)

    def run():
        t0 = time.perf_counter()
        r = cb_core.fit(dec, solver, certify="structural")
        seconds = time.perf_counter() - t0
        with instrumented(probe, solve):
            probe.reset()
            cb_core.fit(dec, solver, certify="structural")
        stamps = np.asarray(probe.stamps + [seconds])  # the plain fit's own stop ends the trace
        trace = np.asarray(probe.trace + [np.asarray(r.alpha, np.float64)])
        return seconds, r.n_iter, trace, stamps, probe.passes

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
            elif method.startswith("scipy L-BFGS-B"):
                run = scipy_worker(load_npz(arg), np.float64 if method.endswith("f64") else np.float32)
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

    def __init__(self, method, out_dir, threads: int | None = None):
        self.method = method
        self.proc = subprocess.Popen([sys.executable, __file__, method, out_dir], env=pinned_env(threads),
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


if __name__ == "__main__":
    worker_main(*sys.argv[1:3])
