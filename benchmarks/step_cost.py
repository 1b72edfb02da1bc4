"""Per-step LM cost of CB-Agent against its floor, on recorded ALFWorld steps, side by side.

A CB-Agent step makes two LM calls: the routing peek under the ReAct prompt (header and
demonstrations pinned once per task type, the episode's history cached; the step's new tokens
and the first reply token in one pass) and the scoring of the candidate set on the scoring
context (its own cached stream; the step's new context tokens and every candidate's tokens in
one packed pass). The *floor* is what the step's new tokens must cost at least: ONE forward
pass over only those tokens (the latest observation, the action and every candidate's tokens)
on top of the already cached context, with the LM head at the candidate tokens. CB-Agent's
routing pass cannot join it: it reads the new tokens again under the demonstrations (another
context, so other keys and values). Both are replayed on the same recorded steps (expert
trajectories of ALFWorld's train split that are not the demonstrations), alternating step by
step so that both share the load of a busy machine; forward passes per step are counted.
CB-Agent's step is timed with each candidate layout of :mod:`agent_shell.lm.scoring` (``tree``,
the default: shared token prefixes encoded once; ``packed``: every candidate's tokens), in
rotating order, each with its own scoring stream. ``mean_new_tokens_per_step`` counts the step's
new tokens (the floor's pass), ``mean_candidate_tokens_per_step`` the candidates' tokens among
them and ``mean_tree_nodes_per_step`` what the tree layout's scoring pass encodes instead of
those. Target: cb-agent <= 1.5x the floor.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/step_cost.py --episodes 3 --steps 10 --dtype float32
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/step_cost.py --tiny        # 1 episode, 3 steps
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--expert", default=None, help="expert trajectories JSONL (default: the cache's "
                        "expert/alfworld/train.jsonl, written by any cb-agent run)")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="steps replayed per episode")
    parser.add_argument("--demos-per-type", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--layouts", default="tree,packed", help="candidate layouts timed side by side")
    parser.add_argument("--tiny", "--smoke", action="store_true", help="1 episode, 3 steps")
    parser.add_argument("--out", default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    if args.tiny:
        args.episodes, args.steps = 1, 3

    import torch

    from agent_shell import context as ctx
    from agent_shell.agents import AgentConfig, CBAgent
    from agent_shell.candidates import fixed_action_space
    from agent_shell.demos import rendered_demos
    from agent_shell.lm import load_language_model
    from agent_shell.lm.kv_cache import restore, snapshot
    from agent_shell.lm.scoring import cached_length, candidate_tree
    from envs.paths import cache_dir
    from envs.trajectory import read_trajectories

    path = Path(args.expert) if args.expert else cache_dir() / "expert" / "alfworld" / "train.jsonl"
    trajectories = [t for t in read_trajectories(path) if t.won]
    by_type = defaultdict(list)
    for t in trajectories:
        by_type[t.task_type].append(t)
    demos = rendered_demos([t for ts in by_type.values() for t in ts[:args.demos_per_type]])
    held_out = [t for ts in by_type.values() for t in ts[args.demos_per_type:]][:args.episodes]
    if not held_out:
        raise SystemExit(f"{path}: no trajectories beyond the {args.demos_per_type} demonstrations per type")

    lm = load_language_model(None, dtype=args.dtype)
    config = AgentConfig.for_env("alfworld")
    layouts = args.layouts.split(",")
    scorers = {}
    for layout in layouts:
        scorers[layout] = lm.fork()
        scorers[layout].candidate_layout = layout
    agent = CBAgent(lm, demos, None, config, scorer=scorers[layouts[0]])
    floor_lm = lm.fork()
    prefix = ctx.action_prefix("text")
    passes = [0]  # forward passes of cb-agent's routing and scoring views
    for view in (agent.lm, *scorers.values()):
        def counted(*a, _forward=view._forward, **kw):
            passes[0] += 1
            return _forward(*a, **kw)
        view._forward = counted
    cb_s = dict.fromkeys(layouts, 0.0)
    cb_passes = dict.fromkeys(layouts, 0)
    floor_s, new_tokens, n, tree_nodes, cand_tokens = 0.0, 0, 0, 0, 0
    for traj in held_out:
        agent.pin_head(traj.task_type)
        env_steps = [i for i, s in enumerate(traj.steps) if s.kind == "env"][:args.steps]
        for i in env_steps:
            history = traj.steps[:i]
            scoring = ctx.scoring_context(traj.instruction, traj.observation, history)
            candidates = fixed_action_space(traj.steps[i].candidates)
            # cb-agent's LM work on this step: the routing peek (once, counted in every layout's
            # step) + candidate scoring with each layout (rotating order, each its own stream)
            t, before_passes = time.perf_counter(), passes[0]
            agent.route(ctx.react_prompt(config.header, demos[traj.task_type], scoring, config.task_header))
            route_s, route_passes = time.perf_counter() - t, passes[0] - before_passes
            order = layouts[n % len(layouts):] + layouts[:n % len(layouts)]
            for layout in order:
                t, before_passes = time.perf_counter(), passes[0]
                scorers[layout].score(scoring, candidates, prefix)
                cb_s[layout] += route_s + time.perf_counter() - t
                cb_passes[layout] += route_passes + passes[0] - before_passes
            toks = lm.tokens.continuations(lm.render(scoring, prefix), candidates)
            s = cached_length(toks)
            tree_nodes += len(candidate_tree(toks, s, "tree").tokens)
            cand_tokens += sum(len(t.ids) - s for t in toks)
            # the floor: one forward over the step's new tokens on the cached earlier context
            before = ctx.scoring_context(traj.instruction, traj.observation, history[:-1]) if history else ""
            old_ids = floor_lm.encode(before) if before else floor_lm.encode("")[:1]
            step_text = scoring[len(before):] + "".join(prefix + c for c in candidates)
            new_ids = floor_lm.tokens.tokenizer(step_text, add_special_tokens=False)["input_ids"]
            with torch.inference_mode():
                cache = floor_lm.cache.prefill(old_ids, floor_lm._forward)
                saved = snapshot(cache)
                t = time.perf_counter()
                n_cand = len(floor_lm.tokens.tokenizer("".join(prefix + c for c in candidates),
                                                       add_special_tokens=False)["input_ids"])
                floor_lm._forward(torch.tensor([new_ids]), cache,
                                  position_ids=torch.arange(len(old_ids), len(old_ids) + len(new_ids))[None],
                                  logits_to_keep=n_cand)
                floor_s += time.perf_counter() - t
                restore(cache, saved)
            new_tokens += len(new_ids)
            n += 1
    load = os.getloadavg()
    figures = {"steps": n, "dtype": str(lm.dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
               "floor_s_per_step": floor_s / n, "mean_new_tokens_per_step": new_tokens / n,
               "mean_candidate_tokens_per_step": cand_tokens / n, "mean_tree_nodes_per_step": tree_nodes / n,
               "floor_passes_per_step": 1, "target_ratio": 1.5}
    for layout in layouts:
        figures[f"cb_agent_{layout}_s_per_step"] = cb_s[layout] / n
        figures[f"ratio_{layout}_to_floor"] = cb_s[layout] / floor_s
        figures[f"cb_agent_{layout}_passes_per_step"] = cb_passes[layout] / n
    for other in layouts[1:]:
        figures[f"{other}_over_{layouts[0]}"] = cb_s[other] / cb_s[layouts[0]]
    figures["load_average_1_5_15"] = [round(x, 2) for x in load]
    print(json.dumps(figures, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
