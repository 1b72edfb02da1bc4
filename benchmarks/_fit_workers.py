"""The worker processes of ``fit_speed.py``: the float64 judge's model and one timed fit per method.

:class:`Worker` starts ``python _fit_workers.py METHOD OUT_DIR`` (:func:`worker_main`) and keeps it
for every problem (one import of torch or JAX per method). The methods and their timing rules are
described in ``fit_speed.py``. Not a benchmark itself (no ``main``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

SEED_LR, SEED_STEPS, SEED_TOL = 0.01, 1500, 1e-4


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
        self.proc = subprocess.Popen([sys.executable, __file__, method, out_dir],
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
