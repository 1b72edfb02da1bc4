"""``cb-agent fit-concepts``: one concept per task type from won expert trajectories (cached)."""

from __future__ import annotations

from pathlib import Path

import click

from agent_shell.commands._common import COMMON_OPTIONS, cli_errors, config_options, make_console
from agent_shell.pipeline import prepare
from agent_shell.run_config import RunConfig


@click.command("fit-concepts")
@config_options(*COMMON_OPTIONS, "out_dir",
                out_dir={"help": "Also copy the concept files here (they always stay in the cache)."})
def fit_concepts(config: RunConfig) -> None:
    """Collect expert demonstrations, compute features with the backbone, fit and save concepts.

    With --lam auto each task type's strength is chosen by cross-validation over its trajectories;
    --out-dir then also receives the curves (strength.json, strength.png)."""
    from rich.table import Table

    with cli_errors():
        setup = prepare(config, need_concepts=True, echo=click.echo)
    try:
        table = Table(title=f"Concepts ({setup.lm.name}, rendering {config.rendering}, features {config.features}, "
                            f"lam {config.lam}, gamma {config.gamma})")
        for col in ("task type", "trajectories", "decisions", "skipped expert steps", "lam", "loss", "grad norm",
                    "converged"):
            table.add_column(col)
        for task_type, tf in sorted(setup.features.items()):
            c = setup.concepts.get(task_type)
            fit = c.metadata["fit"] if c is not None else {}
            skipped = ", ".join(f"{a} x{n}" for a, n in tf.skipped_actions.most_common(3))
            table.add_row(task_type, f"{len(tf.task_ids)} (+{tf.n_lost} lost)", str(tf.n_decisions),
                          f"{tf.n_skipped} of {tf.n_env_steps}" + (f" ({skipped})" if skipped else ""),
                          f"{c.metadata['lam']:.4g}" if c is not None else "-", f"{fit.get('loss', float('nan')):.4f}", f"{fit.get('grad_norm', float('nan')):.1e}",
                          str(fit.get("converged", "-")))
        make_console().print(table)
        out_dir = config.out_dir
        if out_dir is not None and setup.concepts_dir is not None:
            from agent_shell.concepts import copy_concepts

            copy_concepts(setup.concepts_dir, out_dir)
            click.echo(f"concepts copied to {out_dir}")
            curves = {t: c.metadata["strength"] for t, c in setup.concepts.items() if "strength" in c.metadata}
            if curves:  # --lam auto: each type's cross-validation curve, as numbers and as a picture
                from agent_shell.charts import save_figure, strength_figure
                from cb_io.storage import write_json_atomic

                write_json_atomic(Path(out_dir) / "strength.json", curves)
                save_figure(strength_figure(curves), Path(out_dir) / "strength.png", dpi=120)
                click.echo(f"the strengths' cross-validation curves: {out_dir}/strength.json, strength.png")
    finally:
        setup.env.close()
