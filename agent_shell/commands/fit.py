"""``cb-agent fit DECISIONS.npz --out CONCEPT``: fit a concept on a decision-set file.

Imports JAX only inside the command (``cb-agent --help`` stays fast) and turns on the compile
cache (:mod:`cb_core.cache`: JAX's persistent compilation cache and the fit's stored executables,
each checked against its digest before it is loaded) in the shell's cache directory
(``<cache>/jax``, cache = $CB_AGENT_CACHE or ~/.cache/cb-agent) so a one-off fit does not pay the
compile again after the first run on a given shape bucket. A decision-set file whose arrays
declare more than ``--max-gib`` is refused from its headers, and running out of memory is one line.
"""

from __future__ import annotations

import json
import math
import sys
import time

import click


class SolverChoice(click.Choice):
    """``--method``'s choices: the registered solvers (:data:`cb_core.SOLVERS`), read when first
    needed (cb_core imports JAX, which ``cb-agent --help`` does not load)."""

    def __init__(self) -> None:
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        import cb_core

        return tuple(cb_core.SOLVERS)

    @choices.setter
    def choices(self, value: tuple) -> None:  # click.Choice.__init__ sets it; the registry is the source
        pass


@click.command("fit")
@click.argument("decisions", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False),
              help="Concept file to write (safetensors + JSON metadata).")
@click.option("--lam", default=1.0, show_default=True, type=float, help="L2 strength (Eq. 6).")
@click.option("--gamma", default=0.8, show_default=True, type=float,
              help="Prior length-normalisation exponent.")
@click.option("--eps", default=1e-6, show_default=True, type=float, help="Feature std floor.")
@click.option("--method", default="newton", show_default=True, type=SolverChoice(),
              help="Solver, by the name it is registered under (cb_core.SOLVERS; the built-in ones: "
                   "docs/concept.md).")
@click.option("--max-iter", default=None, type=int, help="Iteration cap (default: the solver's).")
@click.option("--tol", default=None, type=float,
              help="Gradient-norm tolerance (default: the solver's; unset, 1e-3 in float32 and 1e-7 in "
                   "float64).")
@click.option("--float64", "float64", is_flag=True, help="Fit in float64.")
@click.option("--certify", default="auto", show_default=True,
              type=click.Choice(["auto", "exact", "structural"]),
              help="Measure the Hessian's smallest eigenvalue (auto: when cheap).")
@click.option("--backbone", default=None, help="LM name (default: the file's metadata or 'unknown').")
@click.option("--task-type", default=None, help="Task type (default: file metadata or 'unknown').")
@click.option("--features", "features", default=None,
              help="Feature construction (default: file metadata or the App. B default).")
@click.option("--no-cache", is_flag=True, help="Do not use the persistent compilation cache.")
@click.option("--max-gib", default=4.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Refuse a decision-set file whose arrays declare more than this many GiB "
                   "(checked on the file's headers before anything is read).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON line.")
def fit(decisions, out, lam, gamma, eps, method, max_iter, tol, float64, certify, backbone,
        task_type, features, no_cache, max_gib, as_json):
    """Fit a concept on DECISIONS.npz (hidden, log_q, n_tokens, offsets, expert) and save it."""
    start = time.perf_counter()
    import cb_core
    from cb_core.cache import enable_persistent_cache
    from cb_core.decision_file import load_decisions_metadata
    from cb_io.storage import write_bytes_atomic

    if not no_cache:
        from cb_io.paths import cache_root  # the project's one cache root (no engine is imported)

        # the fit needs no cache: without one (a warning line) it compiles again, as JAX's own cache does
        enable_persistent_cache(cache_root() / "jax", write_bytes_atomic)
    timings = {"import_s": time.perf_counter() - start}
    solver = cb_core.SOLVERS[method]
    options = {k: v for k, v in (("max_iter", max_iter), ("tol", tol)) if v is not None}
    try:
        t = time.perf_counter()
        dec = cb_core.load_decisions(decisions, max_bytes=int(max_gib * 2**30))
        meta = load_decisions_metadata(decisions)
        timings["load_s"] = time.perf_counter() - t
        result = cb_core.fit(dec, solver(**options), lam=lam, gamma=gamma, eps=eps,
                             dtype="float64" if float64 else "float32", certify=certify)
        timings["fit_s"] = result.seconds
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    except MemoryError as err:
        raise click.ClickException(f"{decisions}: not enough memory to load and fit it ({type(err).__name__}: "
                                   f"{err}); fit it on a machine with more memory, or lower --max-gib to refuse "
                                   "such files early") from None
    trajectories = meta.get("trajectories", [])
    concept = cb_core.Concept.from_fit(
        result,
        backbone=backbone or str(meta.get("backbone", "unknown")),
        features=features or meta.get("features", "seed App. B: last-layer hidden state at the "
                                      "action's final token, standardised per candidate set"),
        task_type=task_type or str(meta.get("task_type", "unknown")),
        trajectories=trajectories,
        extra={"decisions_file": str(decisions)},
    )
    t = time.perf_counter()
    write_bytes_atomic(out, concept.to_bytes())
    timings["save_s"] = time.perf_counter() - t
    elapsed = timings["command_s"] = time.perf_counter() - start
    if as_json:
        c = result.certificate
        summary = dict(out=str(out), method=result.method, n_decisions=result.n_decisions,
                       hidden_size=result.hidden_size, loss=result.loss, grad_norm=result.grad_norm,
                       n_iter=result.n_iter, converged=result.converged, gap_bound=c.gap_bound,
                       min_hessian_eig=c.min_hessian_eig, fit_seconds=result.seconds,
                       command_seconds=elapsed, timings=timings)
        # strict JSON: a number JSON cannot hold (an overflowing bound) is null, never NaN/Infinity
        click.echo(json.dumps({k: v if not isinstance(v, float) or math.isfinite(v) else None
                               for k, v in summary.items()}, allow_nan=False))
    else:
        click.echo(result.summary())
        click.echo(f"saved {out} (command time {elapsed:.2f}s)")
    if not result.converged:
        click.echo("warning: not converged (gradient norm above tolerance)", err=True)
        sys.stdout.flush()
