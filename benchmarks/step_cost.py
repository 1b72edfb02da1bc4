"""Per-step LM cost of CB-Agent against its floor, on recorded ALFWorld steps, side by side.

A CB-Agent step makes two LM calls: the routing peek under the ReAct prompt (header and
demonstrations pinned once per task type, the episode's history cached; the step's new tokens
and the first reply token in one pass) and the scoring of the candidate set on the scoring
context (its own cached stream; the step's new context tokens and the candidates in one pass).

The *floor* (the target's floor) is what a step's scoring must encode at least: ONE forward pass
over the scoring context's tokens that are not cached yet (the same count CB-Agent's scoring
stream encodes) followed by the candidates' prefix tree (shared token prefixes once,
:func:`agent_shell.lm.scoring.packed_pass`), with the LM head at the rows that predict action
tokens. The *old floor* is the same pass with every candidate's tokens instead of the tree
(``packed``): more tokens than an exact method must encode, so a ratio to it flatters.

The *routing floor* is ONE forward pass over the ReAct prompt's uncached tokens (the same count
the routing stream encodes) on that prompt's own cached stream, with the LM head at the last row
only: what the routing peek's first token needs. The *step floor* is the floor plus the routing
floor: the two passes a step must make when it routes under one context and scores under another.
``ratio_tree_to_step_floor`` is what CB-Agent spends beyond those passes (its bookkeeping:
rendering, tokenising, the prefix tree, log-normalisers); ``ratio_route_to_route_floor`` the
routing peek's own share of it.

The target (<= 1.3x the floor) cannot be reached by a method that must also route under another
context: the routing pass reads the step's new tokens again under the demonstrations (other keys
and values, so it cannot join the scoring pass), and that pass alone costs most of the floor
(``results/step_cost_float32.json`` and ``results/step_cost_bfloat16.json``: the routing floor
0.71x the floor in float32 and 0.51x in bfloat16), 2.4 and 1.7 times the 0.3x of the floor the
target leaves beyond it (``route_floor_over_target_gap``). Both verdicts are printed:
the step against the floor (the target's verdict) and the step against the step floor, each
against 1.3.

Timed paths, on the same recorded steps (expert trajectories of ALFWorld's train split that
are not the demonstrations): CB-Agent's step with each candidate layout of
:mod:`agent_shell.lm.scoring` (``--layouts``, each its own scoring stream; the routing peek is
timed once a step, as one more path of the rotation, and counted in each), the floor, the old
floor and the routing floor (their own cached streams; the step floor's time is the floor's plus
the routing floor's, round by round).
Every path runs on ``--threads`` threads (default 1) on as many CPUs: torch's, OpenMP's and BLAS's
pools and XLA's CPU client alike (:func:`_targets.pinned`, entered before torch and JAX load), so
the JAX path cannot use a core the PyTorch paths do not.
With ``--backend jax`` one more path joins the rotation: the same step (routing peek and
scoring, first layout) by a CB-Agent over the JAX backend (:mod:`agent_shell.lm.jax_backend`, the
same weights in the same dtype, its own pinned heads and streams); ``ratio_jax_step_to_torch_step``
is its time over the PyTorch step's (target: at most 1 in float32), and
``jax_programs_after_step`` the programs it has compiled after each step, round by round (the
warm-up first; an episode must stop compiling after its first steps). ``--warmup`` replays
every step once, untimed, before the timed rounds: the steady state of a long run, whose programs
are compiled once (or loaded from the executable store), not the compile.
Their order rotates step by step, so all share the load of a busy machine; the replay is
repeated ``--rounds`` times and each ratio is the median of the rounds' paired ratios. Forward
passes are counted by one counter wrapped around every view's forward, floors included.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/step_cost.py --episodes 3 --steps 10 --dtype float32
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/step_cost.py --tiny        # 1 episode, 3 steps, 1 round
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _targets import machine, median_ratio, pinned, report, rotated, verdict  # noqa: E402

TARGET = 1.3  # CB-Agent's step over the floor (and over the step floor), at most
FLOORS = {"floor": "tree", "old_floor": "packed"}  # floor name -> layout of its candidates
ROUTE_FLOOR = "route_floor"  # one pass over the routing prompt's uncached tokens, on its own stream


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--expert", default=None, help="expert trajectories JSONL (default: the cache's "
                        "expert/alfworld/train.jsonl, written by any cb-agent run)")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="steps replayed per episode")
    parser.add_argument("--rounds", type=int, default=3, help="replays of every step (ratios: median over rounds)")
    parser.add_argument("--demos-per-type", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--layouts", default="tree,packed", help="candidate layouts timed side by side")
    parser.add_argument("--tiny", "--smoke", action="store_true", help="1 episode, 3 steps, 1 round")
    parser.add_argument("--out", default=None, help="write the figures here as JSON")
    parser.add_argument("--backend", choices=("torch", "jax"), default="torch",
                        help="jax: also time the step by the JAX backend, beside the PyTorch one")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads of every path alike, on as many CPUs: torch, OpenMP, BLAS and XLA's CPU client "
                             "(0: each library's own default, every CPU)")
    parser.add_argument("--warmup", action="store_true",
                        help="replay every step once, untimed, before the timed rounds (every path: the JAX "
                             "backend compiles its programs there; the PyTorch paths fill their caches alike)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.episodes, args.steps, args.rounds = 1, 3, 1
    with pinned(args.threads or None):  # before torch and JAX load: XLA reads its pool's size then
        return measure(args)


def measure(args: argparse.Namespace) -> int:
    """The timed replay of :func:`main`'s arguments."""
    import torch

    from agent_shell import context as ctx
    from agent_shell.agents import AgentConfig, CBAgent
    from agent_shell.candidates import fixed_action_space
    from agent_shell.demos import rendered_demos
    from agent_shell.lm import load_language_model
    from agent_shell.lm.torch_kv import restore, snapshot
    from agent_shell.lm.scoring import cached_length, candidate_tree, packed_pass
    from agent_shell.lm.tokenization import common_prefix_len
    from cb_io.paths import cache_dir
    from cb_io.records import read_trajectories

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
    agent = CBAgent(lm, demos, concepts=None, config=config, scoring_lm=scorers[layouts[0]])
    floor_lm, route_floor_lm = lm.fork(), lm.fork()  # the routing floor's stream shares the pinned heads
    jax_agent = jax_scorer = None
    if args.backend == "jax":
        jax_lm = load_language_model("jax:", dtype=args.dtype, device="cpu")
        jax_scorer = jax_lm.fork()
        jax_scorer.candidate_layout = layouts[0]
        jax_agent = CBAgent(jax_lm, demos, concepts=None, config=config, scoring_lm=jax_scorer)
    prefix = ctx.action_prefix("text")
    passes = [0]  # every forward pass of every view: routing, scoring streams and floors
    for view in (agent.lm, *scorers.values(), floor_lm, route_floor_lm):
        def counted(*a, _forward=view._forward, **kw):
            passes[0] += 1
            return _forward(*a, **kw)
        view._forward = counted
    reference = scorers[layouts[0]]  # the floor's cached prefix is this stream's

    def floor(layout: str, toks, s: int, start: int) -> None:
        """One forward over the context's uncached tokens and the candidates (``layout``)."""
        cache = floor_lm.cache.prefill(toks[0].ids[:start], floor_lm._forward)  # untimed: the cached context
        saved = snapshot(cache)
        p = packed_pass(toks, s, start, layout, floor_lm.dtype, floor_lm.device)
        timed(f"{name_of[layout]}", lambda: floor_lm._forward(p.input_ids, cache, position_ids=p.positions,
                                                               attention_mask=p.mask, logits_to_keep=p.keep))
        restore(cache, saved)

    def route_floor(ids: list[int], start: int) -> None:
        """One forward over the routing prompt's uncached tokens ``ids[start:]`` on the prompt's own
        cached stream, logits at the last row only (what the peek's first token needs)."""
        cache = route_floor_lm.cache.prefill(ids[:start], route_floor_lm._forward)  # untimed: the cached prompt
        saved = snapshot(cache)
        new = torch.tensor([ids[start:]], device=route_floor_lm.device)
        positions = torch.arange(start, len(ids), device=route_floor_lm.device)[None]
        timed(ROUTE_FLOOR, lambda: route_floor_lm._forward(new, cache, position_ids=positions, logits_to_keep=1))
        restore(cache, saved)

    name_of = {layout: name for name, layout in FLOORS.items()}
    paths = ["route", *(f"cb_agent_{layout}" for layout in layouts), *FLOORS, ROUTE_FLOOR,
             *(["jax_step"] if jax_agent is not None else [])]
    jax_programs: list[list[int]] = [[] for _ in range(args.rounds + 1)]  # programs after each step, by round
    seconds = {p: [0.0] * args.rounds for p in paths}
    step_passes = {p: 0 for p in paths}
    counts = defaultdict(int)  # token counts summed over steps (first round)
    round_ = 0

    def timed(name: str, call) -> tuple[float, int]:
        t, before = time.perf_counter(), passes[0]
        with torch.inference_mode():
            call()
        dt, n = time.perf_counter() - t, passes[0] - before
        if name in seconds and round_ >= 0:
            seconds[name][round_] += dt
            step_passes[name] += n
        return dt, n

    k = 0  # steps so far: the rotation
    warmup = 1 if args.warmup else 0
    for round_ in range(-warmup, args.rounds):  # round -1: the untimed warm-up
        for traj in held_out:
            agent.pin_head(traj.task_type)
            if jax_agent is not None:
                jax_agent.pin_head(traj.task_type)
            env_steps = [i for i, s in enumerate(traj.steps) if s.kind == "env"][:args.steps]
            for i in env_steps:
                scoring = ctx.scoring_context(traj.instruction, traj.observation, traj.steps[:i])
                candidates = fixed_action_space(traj.steps[i].candidates)
                base, markers = lm.formatter.rendered(scoring, prefix)
                toks = lm.tokens.continuations(base, candidates, markers)
                s = cached_length(toks)
                start = common_prefix_len(reference.cache.ids, toks[0].ids[:s])  # what the stream has cached
                # the routing peek: timed once a step (in the rotation), counted in every layout's step
                prompt = ctx.react_prompt(config.header, demos[traj.task_type], scoring, config.task_header)
                prompt_ids = agent.lm.prompt_ids(prompt, 1)[0]
                route_start = agent.lm.cache.reusable_prefix(prompt_ids[:-1])[0]  # what the routing stream has cached
                routed = agent.lm.cache.encoded_tokens
                for p in rotated(paths, k):
                    if p == "jax_step":  # the whole step: the routing peek, then the scoring
                        timed(p, lambda: (jax_agent.route(prompt), jax_scorer.score(scoring, candidates, prefix)))
                        jax_programs[round_ + warmup].append(len(jax_agent.lm.programs.compiled))
                        continue
                    if p == "route":
                        route = timed("route", lambda: agent.route(prompt))
                        continue
                    if p == ROUTE_FLOOR:
                        route_floor(prompt_ids, route_start)
                        continue
                    if p in FLOORS:
                        floor(FLOORS[p], toks, s, start)
                        continue
                    layout = p.removeprefix("cb_agent_")
                    encoded = scorers[layout].cache.encoded_tokens
                    timed(p, lambda: scorers[layout].score(scoring, candidates, prefix))
                    if layout == layouts[0] and round_ == 0:
                        counts["stream_new_context_tokens"] += scorers[layout].cache.encoded_tokens - encoded
                for layout in layouts:
                    if round_ < 0:
                        break
                    seconds[f"cb_agent_{layout}"][round_] += route[0]
                    step_passes[f"cb_agent_{layout}"] += route[1]
                if round_ == 0:
                    counts["steps"] += 1
                    counts["new_context_tokens"] += s - start
                    counts["candidate_tokens"] += sum(len(t.ids) - s for t in toks)
                    counts["tree_nodes"] += len(candidate_tree(toks, s, "tree").tokens)
                    counts["route_new_tokens"] += agent.lm.cache.encoded_tokens - routed
                    counts["route_floor_tokens"] += len(prompt_ids) - route_start
                    counts["route_context_tokens"] += len(agent.lm.cache.ids)
                    counts["scoring_context_tokens"] += s
                k += 1
    n, n_all = counts["steps"], counts["steps"] * args.rounds
    figures = {"steps": n, "rounds": args.rounds, "warmup": bool(args.warmup),
               "dtype": str(lm.dtype).removeprefix("torch."),
               "threads": torch.get_num_threads(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
               "target_ratio": TARGET,
               **{f"mean_{key}_per_step": counts[key] / n for key in
                  ("new_context_tokens", "stream_new_context_tokens", "candidate_tokens", "tree_nodes",
                   "route_new_tokens", "route_context_tokens", "scoring_context_tokens")}}
    figures["route_floor_tokens_per_step"] = counts["route_floor_tokens"] / n
    figures["floor_tokens_per_step"] = figures["mean_new_context_tokens_per_step"] + figures["mean_tree_nodes_per_step"]
    figures["old_floor_tokens_per_step"] = (figures["mean_new_context_tokens_per_step"]
                                            + figures["mean_candidate_tokens_per_step"])
    figures["step_floor_tokens_per_step"] = figures["floor_tokens_per_step"] + figures["route_floor_tokens_per_step"]
    # the step floor: the scoring floor and the routing floor of the same steps, summed round by round
    seconds["step_floor"] = [a + b for a, b in zip(seconds["floor"], seconds[ROUTE_FLOOR])]
    step_passes["step_floor"] = step_passes["floor"] + step_passes[ROUTE_FLOOR]
    for p in [*paths, "step_floor"]:
        figures[f"{p}_s_per_step"] = statistics.median(seconds[p]) / n
        figures[f"{p}_s_per_step_rounds"] = [x / n for x in seconds[p]]
        if p != "jax_step":  # the counter wraps the PyTorch views' passes
            figures[f"{p}_passes_per_step"] = step_passes[p] / n_all
    verdicts = []
    for layout in layouts:
        for name in [*FLOORS, "step_floor"]:
            figures[f"ratio_{layout}_to_{name}"] = median_ratio(seconds[f"cb_agent_{layout}"], seconds[name])
    for other in layouts[1:]:
        figures[f"{other}_over_{layouts[0]}"] = median_ratio(seconds[f"cb_agent_{other}"],
                                                             seconds[f"cb_agent_{layouts[0]}"])
    # the routing pass against the gap the target leaves beyond the floor (TARGET - 1)
    figures["ratio_route_floor_to_floor"] = median_ratio(seconds[ROUTE_FLOOR], seconds["floor"])
    figures["route_floor_over_target_gap"] = figures["ratio_route_floor_to_floor"] / (TARGET - 1)
    figures["ratio_route_to_route_floor"] = median_ratio(seconds["route"], seconds[ROUTE_FLOOR])
    if jax_agent is not None:
        figures["ratio_jax_step_to_torch_step"] = median_ratio(seconds["jax_step"], seconds[f"cb_agent_{layouts[0]}"])
        figures["jax_programs_after_step"] = [r for r in jax_programs if r]  # by round, the warm-up first
        verdicts.append(verdict(f"JAX step / PyTorch step ({layouts[0]}), {figures['dtype']}",
                                figures["ratio_jax_step_to_torch_step"], 1.0, at_most=True))
    verdicts.append(verdict(f"cb-agent ({layouts[0]}) step / floor, {figures['dtype']}",
                            figures[f"ratio_{layouts[0]}_to_floor"], TARGET, at_most=True))
    verdicts.append(verdict(f"cb-agent ({layouts[0]}) step / step floor (scoring floor + routing floor), "
                            f"{figures['dtype']}", figures[f"ratio_{layouts[0]}_to_step_floor"], TARGET, at_most=True))
    figures["verdicts"] = verdicts
    figures["machine"] = machine()
    return report(figures, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
