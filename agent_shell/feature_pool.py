"""The pipeline's first two steps for the concept studies: a pool of won expert trajectories per
task type and each one's features, kept per trajectory so that concepts can be refitted on any
subset (``cb-agent concepts-tsne``, ``cb-agent concept-data-size``; see
:mod:`agent_shell.studies.concept_data`). Imports no LM, engine nor JAX until called.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from typing import TYPE_CHECKING, Callable

from agent_shell.pipeline import Setup, prepare
from agent_shell.run_config import RunConfig
from cb_io.records import Trajectory

if TYPE_CHECKING:
    from agent_shell.concepts import TypeFeatures


def pooled_features(config: RunConfig, pool: int, echo: Callable[[str], None],
                    need_heldout: tuple[str, int] | None = None, task_types: tuple[str, ...] = (),
                    cached_only: bool = False
                    ) -> tuple[Setup, dict[str, list[TypeFeatures]], dict[str, TypeFeatures] | None]:
    """(setup, task type -> one TypeFeatures per won trajectory, held-out features or None).

    The pool: the first ``pool`` won expert trajectories per type of ``config.demo_split`` (of
    ``task_types`` only, when given); with ``need_heldout = (split, per_type)`` also the held-out
    split's won expert trajectories (after the pool when the split is the same), merged per type.
    ``cached_only``: trajectories whose features are not in the cache yet are left out (counted
    per type), so no LM time is spent. Every feature follows the run's settings
    (the set-up's :attr:`agent_shell.pipeline.Setup.feature_settings`: rendering, layout, seed,
    feature set, candidate cap, calibrator). The setup's env is closed on return.

    Raises:
        ValueError: a task type the split does not have (checked before anything loads), or
            what :func:`agent_shell.pipeline.prepare` raises.
    """
    from agent_shell.concepts import collect_features, features_cached
    from agent_shell.demos import expert_demos, tasks_by_type
    from cb_core.cache import enable_persistent_cache
    from cb_io.storage import write_bytes_atomic
    from envs import make_env

    env = make_env(config.env)
    try:  # task types are checked before anything loads
        known = tasks_by_type(env, config.demo_split)
        unknown = sorted(set(task_types) - set(known))
        if unknown:
            raise ValueError(f"unknown task type(s) {', '.join(unknown)} in {config.env} "
                             f"{config.demo_split}; types: {', '.join(known)}")
        setup = prepare(dataclasses.replace(config, demos_per_type=pool), need_concepts=False, echo=echo, env=env,
                        task_types=set(task_types) or None)
    except BaseException:
        env.close()
        raise
    enable_persistent_cache(setup.cache / "jax", write_bytes_atomic)
    settings = setup.feature_settings

    def usable(trajs: list[Trajectory]) -> list[Trajectory]:
        if not cached_only:
            return trajs
        kept = [t for t in trajs if features_cached(setup.lm, t, settings, setup.cache)]
        missing = Counter(t.task_type for t in trajs if t not in kept)
        for task_type, n in sorted(missing.items()):
            echo(f"{task_type}: {n} trajectories without cached features left out (--cached-only)")
        return kept

    try:
        per_trajectory: dict[str, list[TypeFeatures]] = {}
        start = time.perf_counter()
        setup.demo_trajectories = usable(setup.demo_trajectories)
        for i, traj in enumerate(setup.demo_trajectories, 1):
            for task_type, tf in collect_features(setup.lm, [traj], settings, cache_dir=setup.cache).items():
                if tf.n_decisions:
                    per_trajectory.setdefault(task_type, []).append(tf)
            if i % 10 == 0 or i == len(setup.demo_trajectories):
                echo(f"features {i}/{len(setup.demo_trajectories)} trajectories ({time.perf_counter() - start:.0f} s)")
        heldout = None
        if need_heldout is not None:
            split, per_type = need_heldout
            same = split == config.demo_split
            trajs = expert_demos(setup.env, pool + per_type if same else per_type, split=split,
                                 path=setup.cache / "expert" / config.env / f"{split}.jsonl",
                                 task_types=set(task_types) or None,
                                 on_task=lambda tid: echo(f"collecting expert trajectory {tid}"))
            if same:  # the held-out trajectories follow the pool's
                used = {t.task_id for t in setup.demo_trajectories}
                trajs = [t for t in trajs if t.task_id not in used]
            trajs = usable(trajs)
            heldout = collect_features(setup.lm, trajs, settings, cache_dir=setup.cache)
            echo(f"held out: {len(trajs)} won expert trajectories of {split}, "
                 f"{sum(f.n_decisions for f in heldout.values())} decisions")
    finally:
        setup.env.close()
    return setup, per_trajectory, heldout


__all__ = ["pooled_features"]
