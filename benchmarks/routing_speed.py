"""Routing speed: ReAct's whole-line routing reply, decoded with and without prompt-lookup
drafts, vs. CB-Agent's peek (1-2 tokens), side by side.

CB-Agent and prior-only never execute the routing reply's text; they only need to know whether
the step is a think step. :meth:`agent_shell.agents.CBAgent.route` therefore stops at the first
token that shows letters (at most :data:`agent_shell.agents.cb_agent.ROUTE_PEEK_TOKENS` tokens)
unless they could still begin ``think:``. This script replays the ReAct routing prompts of recorded episodes (a results file
of ``cb-agent run``) step by step through two views of one backbone, each with its own prefix
KV cache (as in a real episode). The whole-line reply is decoded twice: ``full`` as the backend
does by default (greedy, verified in prompt-lookup drafts, :mod:`agent_shell.lm.decoding`) and
``full-plain`` one token per forward pass (``draft_tokens=0``). All methods are timed the same
way: one untimed warm-up call each (on the first prompt, after which the caches are emptied),
then every prompt once per method, the order rotating step by step so that all share the load of
a busy machine. It reports the median and mean seconds per routing call, the ratios of the medians
(full / peek, full-plain / full), the forward passes per call, whether the two whole-line
decodings give the same reply, and whether full and peek agree on the step kind (think vs.
action) at every step.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/routing_speed.py /work/eval/cb-agent/results.jsonl \\
        --episodes 3 --steps 10 --out /tmp/routing_speed.json

``--tiny`` (a smoke test, not a measurement): one episode, three steps, and the recorded
trajectories themselves as demonstrations (no environment is started).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _replay import emit, recorded_episodes, task_start  # noqa: E402


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
    from agent_shell.lm import load_language_model

    records, trajectories, demos = recorded_episodes(args.results, args.episodes, args.tiny)
    lm = load_language_model(None, dtype=args.dtype)
    config = AgentConfig.for_env(records[0]["env"])
    full = ReActAgent(lm, demos, config=config)
    plain_lm = lm.fork()
    plain_lm.draft_tokens = 0
    plain = ReActAgent(plain_lm, demos, config=config)
    peek = CBAgent(lm.fork(), demos, concepts=None, config=config)
    passes = {"full": 0, "full-plain": 0, "peek": 0}

    def counted(name, agent):  # count the backbone's forward passes of each method
        inner = agent.lm._forward

        def forward(*a, **kw):
            passes[name] += 1
            return inner(*a, **kw)

        agent.lm._forward = forward

    def kind(reply: str) -> str:
        try:
            return parse_reply(reply)[0]
        except FormatError:
            return "malformed"

    agents = {"full": full, "full-plain": plain, "peek": peek}
    first = View(task_start(trajectories[0]), ())
    for agent in agents.values():  # warm-up, then empty caches: every timed call starts alike
        agent.route(agent.prompt(first))
        agent.lm.reset_cache()
    for name, agent in agents.items():
        counted(name, agent)
    times = {name: [] for name in agents}
    agree = same_reply = calls = 0
    order = list(agents)
    for traj in trajectories:
        for k in range(min(args.steps, len(traj.steps))):
            view = View(task_start(traj), tuple(traj.steps[:k]))
            replies = {}
            for name in order[calls % 3:] + order[:calls % 3]:
                prompt = agents[name].prompt(view)
                t = time.perf_counter()
                replies[name] = agents[name].route(prompt)
                times[name].append(time.perf_counter() - t)
            calls += 1
            # the peek's kind: think iff the full reply is a think step; malformed/action both act
            agree += (kind(replies["full"]) == "think") == (kind(replies["peek"]) == "think")
            same_reply += replies["full"] == replies["full-plain"]
    median = {name: statistics.median(t) for name, t in times.items()}
    mean = {name: statistics.mean(t) for name, t in times.items()}
    result = {
        "calls": calls,
        "dtype": lm.metadata["dtype"],
        "torch_threads": torch.get_num_threads(),
        **{f"{name.replace('-', '_')}_median_s": median[name] for name in agents},
        **{f"{name.replace('-', '_')}_mean_s": mean[name] for name in agents},
        "speedup_median": median["full"] / median["peek"],
        "speedup_mean": mean["full"] / mean["peek"],
        "draft_speedup_median": median["full-plain"] / median["full"],
        "draft_speedup_mean": mean["full-plain"] / mean["full"],
        "passes_per_call": {name: passes[name] / calls for name in agents},
        "same_reply_with_drafts": f"{same_reply}/{calls}",
        "same_step_kind": f"{agree}/{calls}",
        "all_seconds": times,
    }
    return emit(result, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
