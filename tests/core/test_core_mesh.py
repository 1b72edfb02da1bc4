"""The fits on a device mesh (:mod:`cb_core.mesh`): ``fit_many`` on 8 simulated CPU devices equals
one device within the certificates' bounds, each device holds its share of the split axis (the
problems, or for one large set with few problems its decisions), and the executable store keeps
one executable per placement.

JAX reads ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` once, when its backend starts, so
the 8-device fits run in a subprocess; the checks against the equations (float64 numpy,
core_helpers.reference_model) run here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import cb_core
from cb_core.mesh import device_mesh, padded_size, repeat_first
from core_helpers import reference_model

ROOT = Path(__file__).resolve().parents[2]

#: the decision sets and strengths both processes build (float32, d = 6)
DATA = """
import numpy as np
from cb_core.testing import random_decisions
SETS = [random_decisions(1, [3, 4, 2, 5, 3] * 6, 6), random_decisions(2, [2, 5, 4] * 7, 6)]
LAMS = [0.03, 0.1, 0.3, 1.0, 3.0]
INIT = np.random.default_rng(4).standard_normal((len(LAMS), 7)) * 0.1  # warm starts [K, d + 1]
BIG = random_decisions(3, [3, 6, 2, 4] * 25, 6)
BIG_LAMS = [0.5, 2.0]
"""

#: runs in the subprocess: the fits on 1 and on 8 devices, how the inputs lay on the devices (their
#: addressable shards: device id, the [start, stop) of each axis), the collectives of the programs
#: that split the decisions, the executable store's files
SCRIPT = DATA + """
import json, sys
from pathlib import Path
import jax
import cb_core
import importlib
from cb_core import cache
fit_module = importlib.import_module("cb_core.fit")  # the module (cb_core.fit is the function)
from cb_io.storage import write_bytes_atomic

assert len(jax.devices()) == 8, jax.devices()
shards, compiles = {}, []

def where(x):
    return sorted([s.device.id, [[i.start or 0, n if i.stop is None else i.stop] for i, n in zip(s.index, x.shape)]]
                  for s in x.addressable_shards)

def spy(name, jitted, static, args, out):
    padded = next(a for a in args if hasattr(a, "hidden"))
    shards[name] = dict(hidden=where(padded.hidden), weight=where(args[1] if name == "fit_many" else padded.weight))
    result = real(name, jitted, static, args, out)
    if sys.argv[1] == "decisions":  # the collectives XLA put in the program (the compile is the call's, cached)
        text = jitted.lower(*static, *args).compile().as_text()
        shards[name]["collectives"] = {c: text.count(c) for c in ("all-gather", "all-reduce", "all-to-all")}
    return result

real, fit_module.call_compiled = fit_module.call_compiled, spy
fresh = cache._fresh_compilation
def counted():
    compiles.append(1)
    return fresh()
cache._fresh_compilation = counted

def report(results):
    return [[dict(alpha=r.alpha.tolist(), loss=r.loss, gap=r.certificate.gap_bound, dist=r.certificate.distance_bound,
                  eig=r.certificate.min_hessian_eig) for r in row] for row in results]

out, solver = {}, cb_core.SOLVERS[sys.argv[2]]()
if sys.argv[1] == "problems":
    out["one"] = report(cb_core.fit_many(SETS, solver, lam=LAMS, init=INIT, certify="structural", devices=1))
    out["eight"] = report(cb_core.fit_many(SETS, solver, lam=LAMS, init=INIT, certify="structural", devices=8))
else:  # with the executable store: the 1- and 8-device programs take arguments of the same shapes
    folder = Path(sys.argv[3])
    cache.enable_persistent_cache(folder, write_bytes_atomic)
    files = lambda: sorted(p.name for p in (folder / "executables").glob("fit_many-*.bin"))
    out["one"] = report(cb_core.fit_many(BIG, solver, lam=BIG_LAMS, certify="structural", devices=1))
    out["files_one"], out["compiles_one"] = files(), len(compiles)
    out["eight"] = report(cb_core.fit_many(BIG, solver, lam=BIG_LAMS, certify="exact", devices=jax.devices()))
    out["files_eight"], out["compiles_eight"] = files(), len(compiles) - 1  # the Hessian's program too
    cache._LOADED.clear()  # what a new process sees: the 8-device executable is loaded from its file
    out["again"] = report(cb_core.fit_many(BIG, solver, lam=BIG_LAMS, certify="structural", devices=8))
    out["files_again"], out["compiles_again"] = files(), len(compiles) - 1
    out["fit"] = report([[cb_core.fit(BIG, solver, lam=BIG_LAMS[0], certify="structural", devices=8)]])[0][0]
out["shards"] = shards
print(json.dumps(out))
"""

exec(DATA)  # SETS, LAMS, BIG, BIG_LAMS here too


def _run(*args: str) -> dict:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _reference(dec: cb_core.LabelledDecisions, lam: float):
    """(objective, gradient) of Eq. 6 in float64 numpy from the equations (not from cb_core)."""
    offsets = np.asarray(dec.offsets)
    split = lambda x: np.split(np.asarray(x, np.float64), offsets[1:-1])  # noqa: E731
    _, objective, gradient = reference_model(split(dec.hidden), split(dec.log_q), split(dec.n_tokens),
                                             list(np.asarray(dec.expert)), lam=lam)
    return objective, gradient


def _assert_within_bounds(dec: cb_core.LabelledDecisions, lam: float, one: dict, eight: dict) -> float:
    """The two alphas within the sum of their distance bounds of each other, their objectives within
    the larger gap bound, the bounds recomputed from the reference gradient (||g|| / lam and
    ||g||^2 / (2 lam): strong convexity); returns max |alpha difference|."""
    objective, gradient = _reference(dec, lam)
    a1, a8 = np.asarray(one["alpha"], np.float64), np.asarray(eight["alpha"], np.float64)
    g1, g8 = np.linalg.norm(gradient(a1)), np.linalg.norm(gradient(a8))
    slack = 1e-5  # the float32 gradient the fit stopped on against the float64 one here
    assert np.linalg.norm(a1 - a8) <= (g1 + g8 + 2 * slack) / lam
    assert np.linalg.norm(a1 - a8) <= one["dist"] + eight["dist"] + 2 * slack / lam
    assert abs(objective(a1) - objective(a8)) <= max(g1, g8) ** 2 / (2 * lam) + 1e-6
    assert abs(one["loss"] - objective(a1)) <= 1e-5 and abs(eight["loss"] - objective(a8)) <= 1e-5
    return float(np.abs(a1 - a8).max())


#: Adam compiles fastest; Newton-CG (the default: a conjugate-gradient loop inside the loop) takes
#: about three times as long to compile
SOLVERS = ["adam", pytest.param("newton", marks=pytest.mark.slow)]


@pytest.mark.parametrize("solver", SOLVERS)
def test_fit_many_on_8_devices_splits_the_problems_and_equals_one_device(solver):
    """S = 2 sets x K = 5 strengths from warm starts (2 K > 8: the problems are split, K padded to 8
    by copies of problem 0): each device holds one problem slot of each set and both sets whole;
    every result equals the one-device fit's within the certificates' bounds."""
    out = _run("problems", solver)
    for s, dec in enumerate(SETS):
        for k, lam in enumerate(LAMS):
            _assert_within_bounds(dec, lam, out["one"][s][k], out["eight"][s][k])
    weight = out["shards"]["fit_many"]["weight"]  # [S = 2, K_pad = 8, N_pad]
    assert [d for d, _ in weight] == list(range(8))
    assert sorted(idx[1] for _, idx in weight) == [[k, k + 1] for k in range(8)]
    n_pad = weight[0][1][2][1]
    assert all(idx[0] == [0, 2] and idx[2] == [0, n_pad] for _, idx in weight)
    hidden = out["shards"]["fit_many"]["hidden"]  # [S, N_pad, M_pad, d]: whole on every device
    assert len(hidden) == 8 and all(idx == hidden[0][1] for _, idx in hidden) and hidden[0][1][0] == [0, 2]


@pytest.mark.parametrize("solver", SOLVERS)
def test_one_large_set_on_8_devices_splits_its_decisions_and_equals_one_device(solver, tmp_path):
    """One set of 100 decisions and K = 2 strengths (2 K <= 8: the decisions are split, N_pad 112
    over 8 devices): each device holds 14 decisions of the hidden states and the weights, in the
    fit, in the certificate's Hessian and in ``fit``'s one-problem program, and no program gathers
    them (its collectives are all-reduces); the alphas equal one device's within the bounds, and the
    smallest Hessian eigenvalue measured on 8 devices is the reference Hessian's (central
    differences of the float64 reference gradient). The 1- and 8-device programs take arguments of
    the same shapes: the executable store keeps them apart (the one-device file is never loaded for
    8 devices), and a cleared process loads the 8-device one and gets the same alphas."""
    out = _run("decisions", solver, str(tmp_path))
    assert len(out["files_one"]) == 1 and out["compiles_one"] == 1
    assert len(out["files_eight"]) == 2 and out["compiles_eight"] == 2  # compiled, not the one-device file
    assert out["files_again"] == out["files_eight"] and out["compiles_again"] == 2  # loaded, not compiled
    assert [r["alpha"] for r in out["again"][0]] == [r["alpha"] for r in out["eight"][0]]
    for k, lam in enumerate(BIG_LAMS):
        one, eight = out["one"][0][k], out["eight"][0][k]
        _assert_within_bounds(BIG, lam, one, eight)
        _, gradient = _reference(BIG, lam)
        alpha, h = np.asarray(eight["alpha"], np.float64), 1e-5
        steps = h * np.eye(alpha.size)
        hessian = np.stack([(gradient(alpha + e) - gradient(alpha - e)) / (2 * h) for e in steps])
        smallest = np.linalg.eigvalsh((hessian + hessian.T) / 2)[0]
        assert eight["eig"] >= lam - 1e-5 and abs(eight["eig"] - smallest) <= 1e-4
    shares = [[14 * i, 14 * (i + 1)] for i in range(8)]  # N_pad = 112: the bucket of 100, a multiple of 8
    fit_hidden, fit_weight = out["shards"]["fit_many"]["hidden"], out["shards"]["fit_many"]["weight"]
    assert [d for d, _ in fit_hidden] == list(range(8))
    assert [idx[1] for _, idx in fit_hidden] == shares  # [S, N_pad, M_pad, d]
    assert [idx[2] for _, idx in fit_weight] == shares  # [S, K, N_pad]
    assert all(idx[1] == [0, 2] for _, idx in fit_weight)
    for one_set in ("gram", "fit"):  # one set [N_pad, M_pad, d], its weights [N_pad]
        assert [idx[0] for _, idx in out["shards"][one_set]["hidden"]] == shares
        assert [idx[0] for _, idx in out["shards"][one_set]["weight"]] == shares
    _assert_within_bounds(BIG, BIG_LAMS[0], out["one"][0][0], out["fit"])  # fit: the one-problem program
    for program in ("fit_many", "gram", "fit"):  # the sums over decisions all-reduced, nothing gathered
        collectives = out["shards"][program]["collectives"]
        assert collectives["all-reduce"] > 0 and collectives["all-gather"] == collectives["all-to-all"] == 0


def test_more_devices_than_present_is_one_line():
    present = len(jax.devices())
    for call in (lambda: cb_core.fit(BIG, devices=present + 1),
                 lambda: cb_core.fit_many(SETS, lam=LAMS, devices=present + 1)):
        with pytest.raises(ValueError, match=rf"^devices={present + 1}: only {present} cpu devices? (is|are) "
                                             r"present \(simulated CPU devices: XLA_FLAGS=") as err:
            call()
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=rf"^devices={present + 1}: only"):
        cb_core.select_strengths([BIG], [np.arange(BIG.n_decisions) % 3], devices=present + 1)
    device = jax.devices()[0]
    for bad, message in ((0, "at least 1"), ([], "non-empty"), ([device, device], "twice"), (["cpu:0"], "jax.Device")):
        with pytest.raises(ValueError, match=message):
            device_mesh(bad)


def test_the_mesh_helpers():
    mesh = device_mesh(None)
    assert mesh.size == 1 and mesh.axis_names == ("model",)
    assert device_mesh(mesh).devices.tolist() == mesh.devices.tolist()
    assert [padded_size(n, 8) for n in (1, 8, 9, 16)] == [8, 8, 16, 16]
    x = np.arange(2 * 3).reshape(2, 3)
    assert repeat_first(x, 5).tolist() == [[0, 1, 2, 0, 0], [3, 4, 5, 3, 3]]
    assert repeat_first(None, 5) is None
