"""Routing speed: ReAct's whole-line routing reply vs. CB-Agent's peek (1-2 tokens), side by side.

CB-Agent and prior-only never execute the routing reply's text; they only need to know whether
the step is a think step. :meth:`agent_shell.agents.CBAgent.route` therefore stops at the first
token that shows letters (at most :data:`agent_shell.agents.cb_agent.ROUTE_PEEK_TOKENS` tokens)
unless they could still begin ``think:``. This script replays the ReAct routing prompts of recorded episodes (a results file
of ``cb-agent run``) step by step through two views of one backbone, each with its own prefix
KV cache (as in a real episode). Both methods are timed the same way: one untimed warm-up call
each (on the first prompt, after which both caches are emptied), then every prompt once per
method, the order alternating step by step so that both share the load of a busy machine. It
reports the median and mean seconds per routing call, the ratio of the medians (full / peek),
and whether both methods agree on the step kind (think vs. action) at every step.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/routing_speed.py /work/eval/cb-agent/results.jsonl \\
        --episodes 3 --steps 10 --out /tmp/routing_speed.json

``--tiny`` (a smoke test, not a measurement): one episode, three steps, and the recorded
trajectories themselves as demonstrations (no environment is started).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", help="results JSONL of cb-agent run (ALFWorld)")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="routing calls per episode")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--out", default=None, help="write the figures here as JSON")
    parser.add_argument("--tiny", action="store_true",
                        help="smoke test: 1 episode, 3 steps, the recorded trajectories as demonstrations")
    args = parser.parse_args(argv)
    if args.tiny:
        args.episodes, args.steps = 1, 3

    import torch

    from agent_shell.agents import AgentConfig, CBAgent, ReActAgent, View
    from agent_shell.candidates import FormatError, parse_reply
    from agent_shell.demos import expert_demos, rendered_demos
    from agent_shell.lm import load_language_model
    from agent_shell.runner import read_results
    from envs import make_env
    from envs.trajectory import Trajectory

    records = read_results(args.results)[: args.episodes]
    if not records:
        raise SystemExit(f"no episode records in {args.results}")
    trajectories = [Trajectory.from_record(rec["trials"][0]["trajectory"]) for rec in records]
    if args.tiny:  # won or not, each recorded trajectory serves as a demonstration of its type
        demos = rendered_demos([replace(t, won=True) for t in trajectories])
    else:
        env = make_env(records[0]["env"])
        try:
            demos = rendered_demos(expert_demos(env, int(records[0].get("demos_per_type", 2)), split="train"))
        finally:
            env.close()
    lm = load_language_model(None, dtype=args.dtype)
    config = AgentConfig.for_env(records[0]["env"])
    full = ReActAgent(lm, demos, config)
    peek = CBAgent(lm.fork(), demos, None, config)

    def kind(reply: str) -> str:
        try:
            return parse_reply(reply)[0]
        except FormatError:
            return "malformed"

    agents = {"full": full, "peek": peek}
    first = View(_start(trajectories[0]), ())
    for agent in agents.values():  # warm-up, then empty caches: every timed call starts alike
        agent.route(agent.prompt(first))
        agent.lm.reset_cache()
    times = {"full": [], "peek": []}
    agree = 0
    calls = 0
    for traj in trajectories:
        for k in range(min(args.steps, len(traj.steps))):
            view = View(_start(traj), tuple(traj.steps[:k]))
            replies = {}
            for name in ("full", "peek") if k % 2 == 0 else ("peek", "full"):
                prompt = agents[name].prompt(view)
                t = time.perf_counter()
                replies[name] = agents[name].route(prompt)
                times[name].append(time.perf_counter() - t)
            calls += 1
            # the peek's kind: think iff the full reply is a think step; malformed/action both act
            agree += (kind(replies["full"]) == "think") == (kind(replies["peek"]) == "think")
    result = {
        "calls": calls,
        "dtype": lm.metadata["dtype"],
        "torch_threads": torch.get_num_threads(),
        "full_median_s": statistics.median(times["full"]),
        "peek_median_s": statistics.median(times["peek"]),
        "full_mean_s": statistics.mean(times["full"]),
        "peek_mean_s": statistics.mean(times["peek"]),
        "speedup_median": statistics.median(times["full"]) / statistics.median(times["peek"]),
        "speedup_mean": statistics.mean(times["full"]) / statistics.mean(times["peek"]),
        "same_step_kind": f"{agree}/{calls}",
        "all_seconds": times,
    }
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


def _start(traj):
    from envs.protocol import TaskStart

    return TaskStart(traj.task_id, traj.task_type, traj.instruction, traj.observation)


if __name__ == "__main__":
    raise SystemExit(main())
