"""The JAX backend's compiled programs over one real episode, and what a second process loads.

Plays one game (default: the first ALFWorld ``valid_unseen`` game) with CB-Agent over the JAX
backend (``--model jax:``, the default backbone, float32 on the CPU) for ``--steps`` steps, twice,
each time in a fresh process sharing one cache folder (a temporary copy of the expert data; the
project's executable store, :mod:`cb_core.cache`, lives in it). Per process and step it records
the programs compiled or loaded so far (``JaxLanguageModel.programs.compiled``: one per pass and
bucketed shapes), the executables the store gained (a fresh compile is stored, a loaded one is
not), the step's seconds, and its host transfers: arrays copied to the device (JAX's transfer
guard, logging each one) and arrays copied to the host (each JAX array's value read on the host
for the first time), counted separately for CB-Agent's decision (from the scoring pass to the
chosen index). The first process shows how many programs an episode compiles and
after which step it stops compiling; the second, that a new process compiles none of them.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/jax_programs.py --steps 30 --out results/jax_programs.json
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/jax_programs.py --tiny   # 3 steps of a TextWorld game
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _targets import machine  # noqa: E402


@contextlib.contextmanager
def copies_to_device() -> Iterator[Callable[[], int]]:
    """A function counting the arrays copied to the device so far while the context is open:
    JAX's transfer guard logs each copy on the process's standard error, kept in a file here."""
    import jax

    log = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    seen = {"offset": 0, "count": 0}

    def count() -> int:
        log.seek(seen["offset"])
        new = log.read()
        seen["offset"] += len(new)
        seen["count"] += new.count(b"host-to-device transfer")
        return seen["count"]

    try:
        with jax.transfer_guard_host_to_device("log_explicit"):
            yield count
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        log.close()


def play(env_name: str, split: str, game: str | None, steps: int, dtype: str) -> dict:
    """One episode of CB-Agent over the JAX backend in this process (the cache: ``$CB_AGENT_CACHE``):
    per step, the programs so far, the store's executables so far, the step's seconds and its
    copies to the device and to the host (the decision's apart)."""
    from agent_shell.lm import load_language_model
    from _fetches import host_fetches
    from agent_shell.pipeline import players_of, prepare
    from agent_shell.configure import resolve
    from agent_shell.run_config import RunConfig
    from agent_shell.scheduler import play_episode
    from cb_io.paths import cache_root
    from envs import make_env

    env = make_env(env_name)
    with contextlib.closing(env), host_fetches() as fetched, copies_to_device() as sent:
        game = game or env.tasks(split)[0]
        config = resolve(RunConfig(env=env_name, split=split, model="jax:", dtype=dtype, agents=("cb-agent",),
                                   budget=steps, game_ids=(game,)))
        lm = load_language_model("jax:", dtype=dtype, device="cpu")
        setup = prepare(config, need_concepts=True, env=env, lm=lm, task_types=[env.task_type_of(game)])
        agent = players_of(config, setup)["cb-agent"]
        store = cache_root() / "jax" / "executables"
        rows: list[dict] = []
        last = {"t": time.perf_counter(), "sent": sent(), "fetched": len(fetched)}
        decision = {"sent": 0, "fetched": 0}
        scorer = agent.agent.decision_scorer  # the decision: the scoring pass to the chosen index
        inner = type(agent.agent).decide

        def decide(task_type, request):
            before = sent(), len(fetched)
            out = inner(agent.agent, task_type, request)
            decision["sent"], decision["fetched"] = sent() - before[0], len(fetched) - before[1]
            return out

        agent.agent.decide = decide

        def stepped(trials: list) -> None:
            n_steps = sum(len(t.episode.steps) for t in trials)
            if n_steps == len(rows):  # the call after the last step (the episode ended): no step
                return
            now, n_sent = time.perf_counter(), sent()
            rows.append({"programs": len(lm.programs.compiled), "stored": len(list(store.glob("lm-*"))),
                         "seconds": now - last["t"], "to_device": n_sent - last["sent"],
                         "to_host": len(fetched) - last["fetched"], "decision_to_device": decision["sent"],
                         "decision_to_host": decision["fetched"], "on_device": scorer.reads_hidden_only})
            last.update(t=now, sent=n_sent, fetched=len(fetched))
            decision.update(sent=0, fetched=0)

        record = play_episode(env, agent, game, steps, {"split": split}, on_step=stepped)
    return {"game": game, "steps": record["steps"], "success": record["success"], "per_step": rows,
            "programs": sorted(f"{name} {shape} {shapes}" for name, shape, shapes in lm.programs.compiled)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="alfworld")
    parser.add_argument("--split", default="valid_unseen")
    parser.add_argument("--game", default=None, help="the game (default: the split's first)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--tiny", action="store_true", help="3 steps of the first TextWorld cooking-1 test game")
    parser.add_argument("--out", default=None, help="write the figures here as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one process's episode
    args = parser.parse_args(argv)
    if args.tiny:
        args.env, args.split, args.game, args.steps = "textworld", "test", "cooking-1/test/100001", 3
    if args.child:
        print(json.dumps(play(args.env, args.split, args.game, args.steps, args.dtype)))
        return 0

    from cb_io.paths import cache_root

    expert = cache_root() / "expert" / args.env
    with tempfile.TemporaryDirectory() as tmp:
        if expert.is_dir():  # the expert trajectories, not collected again; nothing compiled is copied
            shutil.copytree(expert, Path(tmp) / "expert" / args.env)
        child = [sys.executable, __file__, "--child", "--env", args.env, "--split", args.split, "--steps",
                 str(args.steps), "--dtype", args.dtype, *(["--game", args.game] if args.game else [])]
        runs = []
        for process in ("first", "second"):
            out = subprocess.run(child, env={**os.environ, "CB_AGENT_CACHE": tmp}, check=True, capture_output=True,
                                 text=True)
            runs.append({"process": process, **json.loads(out.stdout.splitlines()[-1])})
    first, second = runs
    compiling = [i + 1 for i, (a, b) in enumerate(zip([{"programs": 0}] + first["per_step"], first["per_step"]))
                 if b["programs"] > a["programs"]]
    figures = {"env": args.env, "game": first["game"], "steps": first["steps"], "dtype": args.dtype,
               "programs": len(first["programs"]), "steps_that_compiled": compiling,
               "last_step_that_compiled": compiling[-1] if compiling else 0,
               "stored_by_first_process": first["per_step"][-1]["stored"] if first["per_step"] else 0,
               "compiled_by_second_process": (second["per_step"][-1]["stored"] - first["per_step"][-1]["stored"]
                                              if second["per_step"] else 0),
               # the second process reads the concept's features from the cache: its programs are the episode's
               "episode_programs": len(second["programs"]),
               "second_within_first": set(second["programs"]) <= set(first["programs"]),
               "first_step_s": [r["per_step"][0]["seconds"] for r in runs if r["per_step"]],
               **{f"median_{key}_per_step": statistics.median(r[key] for r in second["per_step"])
                  for key in ("to_device", "to_host", "decision_to_device", "decision_to_host")},
               "runs": runs, "machine": machine()}
    print(json.dumps({k: v for k, v in figures.items() if k != "runs"}, indent=1))
    print(f"a step (second process, median): {figures['median_to_device_per_step']} arrays to the device, "
          f"{figures['median_to_host_per_step']} to the host; its decision: {figures['median_decision_to_device_per_step']} "
          f"to the device, {figures['median_decision_to_host_per_step']} to the host (after the argmax)")
    print(f"{figures['programs']} programs in the first process ({figures['episode_programs']} of them the "
          f"episode's, {figures['steps']} steps of {figures['game']}); it compiled at steps "
          f"{figures['steps_that_compiled']}; a second process compiled {figures['compiled_by_second_process']}")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
