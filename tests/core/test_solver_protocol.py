"""The solver protocol: a solver defined here (gradient descent with a fixed step, no cb_core file
touched) fits through cb_core.fit and cb_core.fit_many, checks its own settings, is refused by
fit_many when it says it cannot be batched, and reaches the CLI by registering its name."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from jax import lax

import cb_core
from cb_core.model import Problem, value_and_grad
from core_helpers import random_decisions, reference_model, save_decisions


@dataclasses.dataclass(frozen=True)
class GradientDescent:
    """alpha <- alpha - step grad L(alpha) until ||grad|| <= tol (Eq. 6 is lam-strongly convex)."""

    step: float = 0.1
    tol: float | None = None
    max_iter: int = 3000
    name: ClassVar[str] = "toy-gradient-descent"
    batchable: ClassVar[bool] = True

    def check(self) -> None:
        if not self.step > 0:
            raise ValueError(f"GradientDescent step must be > 0, got {self.step!r}")

    def minimise(self, p: Problem, lam, tol, alpha0=None) -> cb_core.SolverOutput:
        alpha = jnp.zeros(p.hidden.shape[2] + 1, p.hidden.dtype) if alpha0 is None else alpha0

        class Loop(NamedTuple):
            alpha: jax.Array
            value: jax.Array
            grad: jax.Array
            k: jax.Array

        def body(c: Loop) -> Loop:
            alpha = c.alpha - self.step * c.grad
            return Loop(alpha, *value_and_grad(alpha, p, lam), c.k + 1)

        out = lax.while_loop(lambda c: (c.k < self.max_iter) & (jnp.linalg.norm(c.grad) > tol), body,
                             Loop(alpha, *value_and_grad(alpha, p, lam), jnp.asarray(0, jnp.int32)))
        zero = jnp.asarray(0, jnp.int32)
        return cb_core.SolverOutput(out.alpha, out.value, jnp.linalg.norm(out.grad), out.k, zero, 2 * (out.k + 1))


@dataclasses.dataclass(frozen=True)
class Unbatchable(GradientDescent):
    name: ClassVar[str] = "toy-unbatchable"
    batchable: ClassVar[bool] = False


@pytest.fixture(scope="module")
def dec():
    return random_decisions(21, [3, 5, 4, 2, 6, 3, 4, 5], 5)


def reference_gradient(dec, lam):
    """The gradient of Eq. 6 by the independent numpy model (float64)."""
    offsets = np.asarray(dec.offsets)
    split = lambda x: np.split(np.asarray(x, np.float64), offsets[1:-1])  # noqa: E731
    return reference_model(split(dec.hidden), split(dec.log_q), split(dec.n_tokens), np.asarray(dec.expert),
                           lam=lam)[2]


def test_a_solver_defined_outside_cb_core_fits_through_fit_and_fit_many(dec):
    """Its fits reach the optimum of the independent numpy model; fit_many returns S lists of K
    results whether given one LabelledDecisions or a sequence of them."""
    solver = GradientDescent(tol=1e-4)
    one = cb_core.fit(dec, solver, lam=0.5, certify="structural")
    assert one.method == "toy-gradient-descent" and one.converged and one.settings["step"] == 0.1
    assert one.n_iter > 1 and one.n_passes == 2 * one.n_iter + 3  # its own count + the statistics' pass
    # the numpy model's gradient at its alpha is as small as the solver says (float32 rounding aside)
    assert np.linalg.norm(reference_gradient(dec, 0.5)(one.alpha)) <= 1e-4 + 1e-5
    alone = cb_core.fit_many(dec, solver, lam=[0.5, 2.0], certify="structural")
    listed = cb_core.fit_many([dec], solver, lam=[0.5, 2.0], certify="structural")
    assert [len(row) for row in alone] == [len(row) for row in listed] == [2]
    for r, same, lam in zip(alone[0], listed[0], (0.5, 2.0)):
        assert r.converged and r.method == solver.name
        assert np.linalg.norm(reference_gradient(dec, lam)(r.alpha)) <= 1e-4 + 1e-5
        np.testing.assert_array_equal(r.alpha, same.alpha)
    np.testing.assert_allclose(alone[0][0].alpha, one.alpha, atol=1e-4)


def test_its_own_check_and_the_batching_it_declares_are_honoured(dec):
    with pytest.raises(ValueError, match="GradientDescent step must be > 0"):
        cb_core.fit(dec, GradientDescent(step=0.0))
    with pytest.raises(ValueError, match="max_iter"):
        cb_core.fit(dec, GradientDescent(max_iter=-1))
    with pytest.raises(ValueError, match="cannot be batched"):
        cb_core.fit_many(dec, Unbatchable(), lam=[0.5, 2.0])
    with pytest.raises(ValueError, match="solver must be a cb_core solver"):
        cb_core.fit(dec, object())


def test_a_registered_solver_is_a_cli_method(dec, tmp_path):
    from agent_shell.cli import main

    save_decisions(tmp_path / "d.npz", dec)
    cb_core.register_solver(GradientDescent)  # the one line a solver needs to be on the CLI
    try:
        with pytest.raises(ValueError, match="taken"):
            cb_core.register_solver(type("Other", (GradientDescent,), {}))
        res = CliRunner().invoke(main, ["fit", str(tmp_path / "d.npz"), "--out", str(tmp_path / "c.safetensors"),
                                        "--method", GradientDescent.name, "--no-cache", "--certify", "structural",
                                        "--json"])
        assert res.exit_code == 0, res.output
        assert '"method": "toy-gradient-descent"' in res.output
    finally:
        del cb_core.SOLVERS[GradientDescent.name]
    res = CliRunner().invoke(main, ["fit", str(tmp_path / "d.npz"), "--out", str(tmp_path / "c.safetensors"),
                                    "--method", GradientDescent.name])
    assert res.exit_code == 2 and "toy-gradient-descent" in res.output


def test_the_solvers_use_the_models_public_functions_only():
    """No module of the solvers imports a private name (``_...``) of cb_core.model (AST walk)."""
    import ast
    from pathlib import Path

    root = Path(cb_core.__file__).parent
    for name in ("solvers.py", "solver_protocol.py", "fit.py", "fit_arguments.py"):
        tree = ast.parse((root / name).read_text())
        private = [a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                   and node.module == "cb_core.model" for a in node.names if a.name.startswith("_")]
        private += [node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name) and node.value.id == "model" and node.attr.startswith("_")]
        assert private == [], f"cb_core/{name} uses cb_core.model's private {private}"
