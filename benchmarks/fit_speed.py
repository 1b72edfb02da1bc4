"""Fit speed: cb_core L-BFGS and Adam vs a plain PyTorch seed-protocol Adam loop vs scipy L-BFGS-B.

Synthetic decision sets shaped like the seed paper's settings (about 25 candidates a decision):
N = 50, d = 2560 (Qwen3-4B width) and N = 125, d = 5120 (14B width). For each method: wall time
(the first call, which compiles, separately from a warm call), iterations, and the objective gap
to the float64 optimum (every alpha is re-evaluated with the float64 objective), plus ratios.
Then a one-off end-to-end timing (process start to saved concept) of ``cb-agent fit`` with a
cold and a warm persistent compilation cache against the PyTorch loop run the same way.

Target: cb_core L-BFGS >= 10x faster than the PyTorch seed loop at gap <= 1e-6 on both sizes.

Run:   .venv/bin/python benchmarks/fit_speed.py [--sizes 50x2560,125x5120] [--no-cli]
(``--torch-fit DECISIONS.npz OUT.npy`` is the PyTorch loop as a one-off process; used internally.)
Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

SEED_LR, SEED_STEPS, SEED_TOL = 0.01, 1500, 1e-4


# ----------------------------------------------------------------------------------- PyTorch
def torch_seed_fit(hidden, log_q, n_tokens, offsets, expert, lam=1.0, gamma=0.8, eps=1e-6):
    """The seed protocol in plain PyTorch (float32): Adam lr 0.01 from zero, <= 1500 steps,
    stop when ||grad|| < 1e-4. Features and prior computed once, batched on a padded layout.
    Returns (alpha numpy, steps, seconds)."""
    import torch

    t0 = time.perf_counter()
    sizes = np.diff(offsets)
    n, m_max, d = len(sizes), int(sizes.max()), hidden.shape[1]
    seg = np.repeat(np.arange(n), sizes)
    local = np.arange(len(seg)) - offsets[seg]
    h = torch.zeros(n, m_max, d)
    h[seg, local] = torch.from_numpy(hidden)
    mask = torch.zeros(n, m_max, dtype=torch.bool)
    mask[seg, local] = True
    w = mask.float().unsqueeze(-1)
    cnt = w.sum(1, keepdim=True)
    mean = (h * w).sum(1, keepdim=True) / cnt
    cen = (h - mean) * w
    std = ((cen**2).sum(1, keepdim=True) / cnt).sqrt().clamp_min(eps)
    phi = torch.cat([cen / std, (cnt.squeeze(-1) ** -0.5).expand(n, m_max).unsqueeze(-1) * w], -1)
    lq = torch.full((n, m_max), -float("inf"))
    lq[seg, local] = torch.from_numpy(log_q / n_tokens.astype(np.float32) ** gamma)
    prior = torch.log_softmax(lq, -1)
    ex = torch.from_numpy(expert.astype(np.int64))
    alpha = torch.zeros(d + 1, requires_grad=True)
    opt = torch.optim.Adam([alpha], lr=SEED_LR)
    steps = 0
    for steps in range(SEED_STEPS + 1):
        opt.zero_grad()
        s = (prior + phi @ alpha).masked_fill(~mask, -float("inf"))
        logp = torch.log_softmax(s, -1)
        loss = -logp.gather(1, ex[:, None]).mean() + 0.5 * lam * alpha.dot(alpha)
        loss.backward()
        if alpha.grad.norm() < SEED_TOL or steps == SEED_STEPS:
            break
        opt.step()
    return alpha.detach().numpy().copy(), steps, time.perf_counter() - t0


def torch_fit_process(npz: str, out: str) -> None:
    """One-off PyTorch fit process: load the .npz, fit, save alpha (mirrors `cb-agent fit`)."""
    with np.load(npz) as z:
        arrays = {k: z[k] for k in ("hidden", "log_q", "n_tokens", "offsets", "expert")}
    alpha, steps, _ = torch_seed_fit(**arrays)
    np.save(out, alpha)
    print(f"torch seed loop: {steps} steps, saved {out}")


# ----------------------------------------------------------------------------------- scipy
def scipy_lbfgsb(dec, lam=1.0, gamma=0.8, eps=1e-6):
    """scipy L-BFGS-B on a numpy float64 objective (features precomputed in numpy, timed)."""
    import scipy.optimize

    t0 = time.perf_counter()
    offsets = np.asarray(dec.offsets)
    h = np.asarray(dec.hidden, np.float64)
    seg = np.asarray(dec.segment_ids)
    sizes = np.diff(offsets).astype(np.float64)
    n = len(sizes)
    mean = np.add.reduceat(h, offsets[:-1]) / sizes[:, None]
    cen = h - mean[seg]
    std = np.sqrt(np.add.reduceat(cen**2, offsets[:-1]) / sizes[:, None])
    phi = np.concatenate([cen / np.maximum(std, eps)[seg], (sizes ** -0.5)[seg][:, None]], 1)
    lq = np.asarray(dec.log_q, np.float64) / np.asarray(dec.n_tokens, np.float64) ** gamma
    rows = offsets[:-1] + np.asarray(dec.expert)

    def fg(a):
        s = lq + phi @ a
        mx = np.maximum.reduceat(s, offsets[:-1])
        e = np.exp(s - mx[seg])
        z = np.add.reduceat(e, offsets[:-1])
        f = np.sum(np.log(z) + mx - s[rows]) / n + 0.5 * lam * a @ a
        p = e / z[seg]
        r = p.copy()
        r[rows] -= 1.0
        return f, phi.T @ r / n + lam * a

    res = scipy.optimize.minimize(fg, np.zeros(phi.shape[1]), jac=True, method="L-BFGS-B",
                                  options=dict(gtol=1e-5, maxiter=1000))
    return res.x, res.nit, time.perf_counter() - t0


# ----------------------------------------------------------------------------------- main
def run_size(n, d, seed, with_cli, results):
    import jax
    import jax.numpy as jnp

    import cb_core
    from cb_core.synthetic import synthetic_decisions

    dec = synthetic_decisions(n, d, seed=seed)
    print(f"\n=== N = {n}, d = {d}, T = {dec.n_rows} rows "
          f"(M {dec.set_sizes.min()}..{dec.set_sizes.max()}) ===", flush=True)
    with jax.enable_x64(True):
        d64 = cb_core.Decisions(np.asarray(dec.hidden, np.float64),
                                np.asarray(dec.log_q, np.float64), dec.n_tokens, dec.offsets,
                                dec.segment_ids, dec.expert)
        t = time.perf_counter()
        ref = cb_core.fit(dec, cb_core.LBFGS(tol=1e-9), dtype=jnp.float64, certify="structural")
        f_star = float(cb_core.objective(ref.alpha, d64))
        print(f"float64 reference: f* = {f_star:.12f}, |g| = {ref.grad_norm:.1e}, "
              f"{ref.n_iter} it, {time.perf_counter() - t:.1f}s", flush=True)

    def gap(alpha):
        with jax.enable_x64(True):  # every alpha is judged by the float64 objective
            return float(cb_core.objective(np.asarray(alpha, np.float64), d64)) - f_star

    rows = {}
    for solver in (cb_core.LBFGS(), cb_core.Adam()):
        method = solver.name
        first = cb_core.fit(dec, solver, certify="structural")
        warm = cb_core.fit(dec, solver, certify="structural")
        rows[f"cb_core {method}"] = dict(first_s=first.seconds, warm_s=warm.seconds,
                                         iters=warm.n_iter, gap=gap(warm.alpha),
                                         grad_norm=warm.grad_norm)
    t = time.perf_counter()
    cert = cb_core.fit(dec, cb_core.LBFGS(), certify="exact")
    eig_s = time.perf_counter() - t
    alpha, steps, secs = torch_seed_fit(np.asarray(dec.hidden), np.asarray(dec.log_q),
                                        np.asarray(dec.n_tokens), np.asarray(dec.offsets),
                                        np.asarray(dec.expert))
    rows["torch adam (seed)"] = dict(first_s=secs, warm_s=secs, iters=steps, gap=gap(alpha))
    alpha, nit, secs = scipy_lbfgsb(dec)
    rows["scipy L-BFGS-B f64"] = dict(first_s=secs, warm_s=secs, iters=nit, gap=gap(alpha))

    base = rows["torch adam (seed)"]["warm_s"]
    print(f"{'method':<22}{'first (s)':>11}{'warm (s)':>10}{'iters':>7}{'gap to f64 opt':>16}"
          f"{'torch/this':>12}")
    for name, r in rows.items():
        print(f"{name:<22}{r['first_s']:>11.3f}{r['warm_s']:>10.3f}{r['iters']:>7d}"
              f"{r['gap']:>16.2e}{base / r['warm_s']:>12.1f}")
    lb = rows["cb_core lbfgs"]
    ok = base / lb["warm_s"] >= 10 and lb["gap"] <= 1e-6
    print(f"target (L-BFGS >= 10x torch at gap <= 1e-6): {'MET' if ok else 'NOT MET'}; "
          f"exact Hessian-eigenvalue certificate (fit + Gram eig): {eig_s:.2f}s, "
          f"min eig {cert.min_hessian_eig:.6f} (lam = 1)")
    out = dict(n=n, d=d, rows=rows, target_met=ok, exact_certificate_s=eig_s,
               min_hessian_eig=cert.min_hessian_eig)
    if with_cli:
        out["cli"] = cli_timing(dec)
    results.append(out)


def cli_timing(dec):
    import cb_core

    with tempfile.TemporaryDirectory() as tmp:
        npz = os.path.join(tmp, "d.npz")
        cb_core.save_decisions(npz, dec)
        env = dict(os.environ, CB_AGENT_CACHE=os.path.join(tmp, "cache"))
        exe = os.path.join(os.path.dirname(sys.executable), "cb-agent")
        cmd = [exe, "fit", npz, "--out", os.path.join(tmp, "c.safetensors")]
        timings = {}
        for label in ("cold cache", "warm cache"):
            t = time.perf_counter()
            subprocess.run(cmd, env=env, check=True, capture_output=True)
            timings[f"cb-agent fit, {label}"] = time.perf_counter() - t
        t = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--torch-fit", npz,
                        os.path.join(tmp, "alpha.npy")], check=True, capture_output=True)
        timings["torch seed loop process"] = time.perf_counter() - t
    print("one-off process, start to saved concept:")
    for k, v in timings.items():
        print(f"  {k:<28}{v:>8.2f}s")
    return timings


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="50x2560,125x5120")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-cli", action="store_true", help="skip the one-off process timings")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    ap.add_argument("--torch-fit", nargs=2, metavar=("NPZ", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_fit:
        torch_fit_process(*args.torch_fit)
        return
    import jax
    import torch

    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), {os.cpu_count()} CPUs")
    results = []
    for size in args.sizes.split(","):
        n, d = (int(x) for x in size.split("x"))
        run_size(n, d, args.seed, not args.no_cli, results)
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(results, f, indent=1)
        os.replace(tmp, args.json)


if __name__ == "__main__":
    main()
