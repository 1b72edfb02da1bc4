"""Sampling speed: an open action space's sampled replies (CB-Agent on ScienceWorld: 20 replies at
T = 0.7) over one shared prompt cache vs. over a copy of it per row, side by side.

The candidate set of an open action space is ``n`` replies sampled under the routing prompt
(:meth:`agent_shell.agents.CBAgent.candidate_set`). The backend decodes the ``n`` rows
together; ``shared`` reads the prompt's keys and values once for all rows
(:mod:`agent_shell.lm.shared_prefix`, the default), ``copies`` gives every row its own copy of
the prompt's cache (transformers' ``batch_repeat_interleave``, the path before it). This script
replays the routing prompts of recorded episodes (a results file of ``cb-agent run``, e.g.
ScienceWorld's Table 2) step by step through two views of one backbone, each with its own prefix
KV cache (as in a real episode): one untimed warm-up call each (then the caches are emptied),
then every prompt once per method with the agent's seed, the order alternating step by step so
that both share the load of a busy machine. It reports the median and mean seconds per sampling
call, their ratios (copies / shared), the prompt tokens, and how many calls gave the same
replies both ways (same seed: they differ only where float rounding flips a draw).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sampling_speed.py runs/results/scienceworld/results.jsonl \\
        --episodes 3 --steps 4 --out /tmp/sampling_speed.json

``--tiny`` (a smoke test, not a measurement): one episode, two steps, four replies of four
tokens, and the recorded trajectories themselves as demonstrations (no environment is started).
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
    parser.add_argument("results", help="results JSONL of cb-agent run (any env; ScienceWorld's open action space)")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="sampling calls per episode")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--n", type=int, default=None, help="replies per call (default: the agent config's)")
    parser.add_argument("--tokens", type=int, default=None, help="tokens per reply (default: the agent config's)")
    parser.add_argument("--out", default=None, help="write the figures here as JSON")
    parser.add_argument("--tiny", action="store_true",
                        help="smoke test: 1 episode, 2 steps, 4 replies of 4 tokens, recorded trajectories as demos")
    args = parser.parse_args(argv)
    if args.tiny:
        args.episodes, args.steps, args.n, args.tokens = 1, 2, 4, 4

    import torch

    from agent_shell.agents import AgentConfig, CBAgent, View
    from agent_shell.lm import load_language_model

    records, trajectories, demos = recorded_episodes(args.results, args.episodes, args.tiny)
    lm = load_language_model(None, dtype=args.dtype)
    config = AgentConfig.for_env(records[0]["env"])
    n = args.n or config.n_samples
    tokens = args.tokens or config.reply_tokens
    if lm._shared is None:
        raise SystemExit(f"{lm.name!r} has no shared-prefix attention (see agent_shell.lm.shared_prefix.SUPPORTED)")
    copying = lm.fork()
    copying._shared = None
    agents = {"shared": CBAgent(lm.fork(), demos, concepts=None, config=config),
              "copies": CBAgent(copying, demos, concepts=None, config=config)}

    def sample(agent: CBAgent, prompt, seed: int) -> list[str]:
        return agent.lm.generate(prompt, max_new_tokens=tokens, stop=("\n",), temperature=config.sample_temperature,
                                 n=n, seed=seed)

    first = View(task_start(trajectories[0]), ())
    for agent in agents.values():  # warm-up, then empty caches: every timed call starts alike
        sample(agent, agent.prompt(first), config.seed)
        agent.lm.reset_cache()
    times: dict[str, list[float]] = {name: [] for name in agents}
    prompt_tokens: list[int] = []
    same = calls = 0
    order = list(agents)
    for traj in trajectories:
        for k in range(min(args.steps, len(traj.steps))):
            view = View(task_start(traj), tuple(traj.steps[:k]))
            replies = {}
            for name in order[calls % 2:] + order[:calls % 2]:
                prompt = agents[name].prompt(view)
                t = time.perf_counter()
                replies[name] = sample(agents[name], prompt, config.seed + k)
                times[name].append(time.perf_counter() - t)
            prompt_tokens.append(len(lm.prompt_ids(prompt, 0)[0]))
            calls += 1
            same += replies["shared"] == replies["copies"]
    median = {name: statistics.median(t) for name, t in times.items()}
    mean = {name: statistics.mean(t) for name, t in times.items()}
    result = {
        "calls": calls,
        "env": records[0]["env"],
        "replies_per_call": n,
        "tokens_per_reply": tokens,
        "dtype": lm.metadata["dtype"],
        "torch_threads": torch.get_num_threads(),
        "prompt_tokens_median": statistics.median(prompt_tokens),
        "prompt_tokens_max": max(prompt_tokens),
        **{f"{name}_median_s": median[name] for name in agents},
        **{f"{name}_mean_s": mean[name] for name in agents},
        "copies_over_shared_median": median["copies"] / median["shared"],
        "copies_over_shared_mean": mean["copies"] / mean["shared"],
        "same_replies": f"{same}/{calls}",
        "all_seconds": times,
    }
    return emit(result, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
