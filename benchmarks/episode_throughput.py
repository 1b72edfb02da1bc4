"""Episode throughput on Ray: 1 vs 2 workers, and the batched LM actor vs per-episode calls.

Part A plays the same ALFWorld valid_unseen episodes (prior-only, the offline SmolLM2, a short
step budget) with the scheduler's Ray executor on 1 and on 2 workers, each worker with its own
env and backbone (one torch thread), ``--repeats`` times in alternating order (1 then 2 workers,
then 2 then 1, ...). It reports episodes per hour and the speed-up, the median of the
repetitions' paired ratios, on the wall time of ``play_episodes`` (workers' start included) and
on the episodes' running time (``cb-agent report``'s: the start-up left out, as in a long run).
Target on 2 cores: 2 workers >= 1.7x one, compared unrounded. Beside it, the machine's own
ceiling (:func:`ceiling`): the same fixed forward passes in two processes at once against one
alone, no Ray and no games: what two workers could reach if playing were only the LM.

Part B replays recorded scoring calls (expert trajectories' contexts and candidate sets) from 4 and
8 concurrent streams against two LM server actors side by side, in alternating order: one that
batches concurrent calls into one pass (``wait_ms`` 5, up to 16 per pass) and one that serves each
call on its own (``max_batch`` 1, i.e. per-episode calls); it reports calls per second and the mean
latency of a call. Both parts run in one Ray session; the machine's load average is reported, since
a shared machine depresses and disturbs every figure. Every figure is printed unrounded.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/episode_throughput.py --episodes 4 --max-steps 8
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/episode_throughput.py --tiny     # 2 episodes, 2 steps, once
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _targets import machine, median_ratio, rotated, verdict, verdict_line  # noqa: E402

TARGET = 1.7  # 2 workers' episodes per hour over 1 worker's, on 2 cores, at least


def part_a(args) -> dict:
    from agent_shell.parallel import RayExecutor
    from agent_shell.pipeline import build_players, prepare
    from agent_shell.reporting import running_time
    from agent_shell.configure import resolve, task_ids as configured_task_ids
    from agent_shell.run_config import RunConfig
    from agent_shell.scheduler import play_episodes
    from envs import make_env

    config = resolve(RunConfig(env="alfworld", agents=("prior-only",), dtype=args.dtype, budget=args.max_steps,
                               per_type=0, games=args.episodes))
    env = make_env("alfworld")
    try:
        task_ids = configured_task_ids(config, env)
        types = sorted({env.task_type_of(t) for t in task_ids})
        prepare(config, False, echo=lambda line: None, env=env, task_types=types)  # fills the caches once
    finally:
        env.close()
    players = functools.partial(build_players, config, types)
    runs = {1: [], 2: []}
    for r in range(args.repeats):
        for workers in rotated([1, 2], r):  # 1 then 2 workers, then 2 then 1, ...
            with tempfile.TemporaryDirectory() as tmp:
                t = time.perf_counter()
                summary = play_episodes(RayExecutor(players, workers), ["prior-only"], task_ids,
                                        Path(tmp) / "results.jsonl", args.max_steps, meta={"seed": 0})
                wall = time.perf_counter() - t
            records = summary["prior-only"].records
            playing = running_time(records)  # the episodes' own intervals, concurrent ones once
            runs[workers].append({"wall_s": wall, "playing_s": playing.busy_s, "episodes": playing.episodes,
                                  "steps": sum(r["steps"] for r in records)})
    return speedups(runs, len(task_ids), args.max_steps)


#: One process of the ceiling's fixed LM work: after loading the backbone and one warm-up pass, it
#: waits for the common start time, runs ``passes`` forward passes over a fixed 128-token block
#: and prints the seconds they took.
_CEILING_WORK = """
import sys, time, torch
from agent_shell.lm import load_language_model
lm = load_language_model(None, dtype=sys.argv[1])
ids = torch.arange(1000, 1128)[None]
with torch.inference_mode():
    lm.model(input_ids=ids)
    time.sleep(max(0.0, float(sys.argv[3]) - time.time()))
    t = time.perf_counter()
    for _ in range(int(sys.argv[2])):
        lm.model(input_ids=ids)
print(time.perf_counter() - t)
"""


def ceiling(args, passes: int = 40) -> dict:
    """What two single-thread processes gain on this machine, without Ray, the scheduler or the
    games: the same fixed LM work (``passes`` forward passes of the backbone over a 128-token
    block, one torch thread) in one process alone and in two processes at once (both start at one
    moment, after loading), ``--repeats`` times in alternating order. The ceiling is the median of
    the paired ratios 2 x alone / the slower of the two together: the speed-up two workers could
    reach if playing were nothing but forward passes."""
    import subprocess

    env = dict(os.environ, OMP_NUM_THREADS="1")

    def run(processes: int) -> float:
        start = f"{time.time() + 25.0}"  # after every process has loaded the backbone
        procs = [subprocess.Popen([sys.executable, "-c", _CEILING_WORK, args.dtype, str(passes), start], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                 for _ in range(processes)]
        seconds = [float(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError("a ceiling process failed")
        return max(seconds)

    times = {1: [], 2: []}
    for r in range(args.repeats):
        for processes in rotated([1, 2], r):
            times[processes].append(run(processes))
    return {"passes": passes, "alone_s": times[1], "together_s": times[2],
            "ceiling": median_ratio([2 * t for t in times[1]], times[2])}


def speedups(runs: dict[int, list[dict]], episodes: int, budget: int) -> dict:
    """Part A's figures from each repetition's runs on 1 and 2 workers (``wall_s``, ``playing_s``,
    ``episodes``, ``steps`` each): per worker count the medians, and the speed-ups as medians of
    the repetitions' paired ratios (1 worker's time / 2 workers'), compared with the target."""
    out = {"episodes": episodes, "budget": budget, "repeats": len(runs[1])}
    for workers, rows in runs.items():
        wall = statistics.median(x["wall_s"] for x in rows)
        playing = statistics.median(x["playing_s"] for x in rows)
        out[f"workers_{workers}"] = {
            "wall_s": wall, "episodes_per_hour": 3600 * episodes / wall, "playing_s": playing,
            "episodes_per_hour_playing": 3600 * rows[0]["episodes"] / playing, "steps": rows[0]["steps"],
            "runs": rows}
    for key, field in (("speedup_2_vs_1", "wall_s"), ("speedup_2_vs_1_playing", "playing_s")):
        out[key] = median_ratio([x[field] for x in runs[1]], [x[field] for x in runs[2]])
    out["verdicts"] = [verdict(f"2 workers / 1 worker, episodes per hour ({label})", out[key], TARGET, at_most=False)
                       for key, label in (("speedup_2_vs_1", "wall"), ("speedup_2_vs_1_playing", "playing"))]
    out["note"] = ("wall_s includes each worker's start (env + backbone load, paid once per run); playing_s is "
                   "report's running time: the union of the episodes' own intervals, the start-up left out")
    return out


def recorded_calls(n: int) -> list[tuple[str, list[str]]]:
    """(scoring context, candidate set) of recorded expert steps."""
    from agent_shell import context as ctx
    from agent_shell.candidates import fixed_action_space
    from cb_io.paths import cache_dir
    from cb_io.records import read_trajectories

    calls = []
    for traj in read_trajectories(cache_dir() / "expert" / "alfworld" / "train.jsonl"):
        for i, s in enumerate(traj.steps):
            if s.kind == "env" and len(calls) < n:
                calls.append((ctx.scoring_context(traj.instruction, traj.observation, traj.steps[:i]),
                              fixed_action_space(s.candidates)))
    return calls


def part_b(args) -> dict:
    import ray

    from agent_shell.context import action_prefix
    from agent_shell.lm.server import RemoteLM, start_lm_server

    servers = {"batched": start_lm_server(None, args.dtype, threads=2, wait_ms=5, max_batch=16),
               "per_episode": start_lm_server(None, args.dtype, threads=2, max_batch=1, wait_ms=0)}
    out = {}
    try:
        for k in args.concurrency:
            calls = recorded_calls(k * args.calls_per_stream)
            rates = {label: [] for label in servers}
            for r, label in ((r, label) for r in range(args.repeats) for label in rotated(list(servers), r)):
                server = servers[label]  # side by side: same calls, one after the other, order alternated
                streams = [RemoteLM(server) for _ in range(k)]

                def replay(i: int) -> list[float]:
                    lat = []
                    for context, candidates in calls[i::k]:
                        t = time.perf_counter()
                        streams[i].score(context, candidates, action_prefix("text"))
                        lat.append(time.perf_counter() - t)
                    return lat

                t = time.perf_counter()
                with ThreadPoolExecutor(k) as pool:
                    latencies = [x for lat in pool.map(replay, range(k)) for x in lat]
                wall = time.perf_counter() - t
                rates[label].append({"calls_per_s": len(latencies) / wall,
                                     "mean_latency_s": sum(latencies) / len(latencies)})
            for label, rows in rates.items():
                out[f"{label}_{k}"] = {key: statistics.median(x[key] for x in rows) for key in rows[0]}
                out[f"{label}_{k}"]["runs"] = rows
            out[f"throughput_ratio_{k}"] = median_ratio([x["calls_per_s"] for x in rates["batched"]],
                                                        [x["calls_per_s"] for x in rates["per_episode"]])
        out["batch_sizes"] = ray.get(servers["batched"].info.remote())["batches"][-20:]
    finally:
        for server in servers.values():
            ray.kill(server)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--calls-per-stream", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each configuration, order alternated")
    parser.add_argument("--part", choices=["a", "b", "both", "ceiling"], default="both")
    parser.add_argument("--tiny", "--smoke", action="store_true", help="2 episodes of 2 steps, 1 call per stream")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.tiny:
        args.episodes, args.max_steps, args.calls_per_stream, args.repeats = 2, 2, 1, 1

    from agent_shell.parallel import start_ray

    os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                os.environ.get("PYTHONPATH", "")])
    figures = {"machine_before": machine(), "dtype": args.dtype}
    owns = start_ray(2) if args.part != "ceiling" else False  # the ceiling runs without Ray
    import ray

    try:
        if args.part in ("a", "both"):
            figures["workers"] = part_a(args)
            print(json.dumps({"workers": figures["workers"]}), flush=True)  # each part as soon as it is measured
        if args.part in ("b", "both"):
            figures["lm_actor"] = part_b(args)
        if args.part in ("a", "both", "ceiling"):
            figures["machine_ceiling"] = ceiling(args, passes=2 if args.tiny else 40)
    finally:
        if owns:
            ray.shutdown()
    figures["machine_after"] = machine()
    print(json.dumps(figures, indent=1))
    for v in figures.get("workers", {}).get("verdicts", []):
        print(verdict_line(v))
    if "machine_ceiling" in figures:
        print(f"two single-thread processes / one on this machine, same fixed LM work (the ceiling, no target) = "
              f"{figures['machine_ceiling']['ceiling']!r}")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
