"""Programs compiled per episode on the JAX backend, and the padded work per step, side by side with
another checkout.

Two 30-step CB-Agent episodes (:meth:`agent_shell.agents.cb_agent.CBAgent.next_action`) in one
process over ``--model jax:`` with ``host_share``'s tiny random Llama (float32, the CPU): each step
adds a history step whose observation has 5 to 60 words and offers 8 to 40 ALFWorld-like
candidates (drawn per step from a seeded stream; the second episode is another task with other
draws). Counted per episode: the programs compiled (JAX's ``backend_compile_duration`` events, as
``jax_log_compiles`` logs them) and per step the padded work of the backbone's passes: for every
pass run, its padded tokens times a token's multiply-adds through the default backbone's layers
plus its padded LM-head rows times a head row's (SmolLM2-135M's sizes: 30 layers, width 576, MLP
1,536, 9 query and 3 key-value heads, 49,152-token vocabulary; attention over the cache is left
out: it reads the filled slots only, whatever the padding). The ratio of the two checkouts' work
per step (this over the other) is printed.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/episode_compiles.py --base ../base
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/episode_compiles.py --steps 6   # a smoke run
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _targets import machine, report  # noqa: E402

#: The default backbone's sizes (SmolLM2-135M-Instruct).
LAYERS, WIDTH, MLP, HEAD_DIM, HEADS, KV_HEADS, VOCAB = 30, 576, 1536, 64, 9, 3, 49152
TOKEN_MACS = LAYERS * (2 * WIDTH * HEADS * HEAD_DIM + 2 * WIDTH * KV_HEADS * HEAD_DIM + 3 * WIDTH * MLP)
HEAD_MACS = WIDTH * VOCAB
VERBS = ("go to", "open", "close", "take", "put", "examine", "use", "heat", "cool", "clean")
OBJECTS = ("cabinet", "drawer", "mug", "fridge", "shelf", "countertop", "sinkbasin", "desk", "microwave", "apple",
           "knife", "plate", "toaster", "garbagecan", "stoveburner")
TARGET_FIRST, TARGET_RATIO = 4, 1.5


def work(shape) -> int:
    """Multiply-adds of one pass of static ``shape`` (its padded tokens and head rows)."""
    t, k = (shape.t, shape.k) if hasattr(shape, "t") else (0, 0)
    t = t[0] * t[1] if isinstance(t, tuple) else t
    return int(t) * TOKEN_MACS + int(k) * HEAD_MACS


def episode_steps(seed: int, steps: int, words) -> list[tuple[str, list[str]]]:
    """Per step, (its observation, its candidates), from a seeded stream."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        n = int(rng.integers(8, 41))
        pool = [f"{v} {o} {k}" for v in VERBS for o in OBJECTS for k in (1, 2, 3)]
        candidates = sorted(set(rng.choice(pool, n, replace=False).tolist()))
        observation = " ".join(rng.choice(words, int(rng.integers(5, 61))).tolist()) + "."
        out.append((observation, candidates))
    return out


def leg(spec: dict, steps: int) -> dict:
    """Two episodes of this process's checkout: per episode the programs compiled, per step the work."""
    import jax
    import numpy as np

    import agent_shell
    import cb_core
    from agent_shell.agents import AgentConfig, CBAgent
    from agent_shell.agents.step import View
    from agent_shell.lm import load_language_model
    from cb_io.records import Step, TaskStart
    from gpu_check import WORDS

    compiles = collections.Counter()
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, *_a, **_k: compiles.update(["n"]) if event.endswith("backend_compile_duration") else None)
    lm = load_language_model("jax:" + spec["folder"], dtype="float32", device="cpu")
    concept = cb_core.Concept(np.random.default_rng(3).normal(0, 0.3, lm.hidden_size + 1).astype(np.float32),
                              0.8, 1e-6, {})
    agent = CBAgent(lm, {"pick": [spec["demo"]]}, concepts={"pick": concept}, config=AgentConfig.for_env("alfworld"),
                    scoring_lm=lm.fork())
    agent.pin_head("pick")
    programs = lm.programs
    episodes = []
    for e, seed in enumerate((11, 12)):
        start = TaskStart(f"episode-{e}", "pick", spec["instruction"] + f" ({e})", spec["observation"])
        history, per_step, actions = [], [], []
        before_episode, known = compiles["n"], set(programs.compiled)
        for k, (observation, candidates) in enumerate(episode_steps(seed, steps, WORDS)):
            history.append(Step("env", f"open drawer {k}", observation, candidates, False, False, 0.0))
            calls = dict(programs.compiled)
            decision = agent.next_action(View(start, tuple(history), tuple(candidates)))
            actions.append(decision.action)
            per_step.append(sum((n - calls.get(key, 0)) * work(key[1]) for key, n in programs.compiled.items()))
        new = sorted(f"{key[0]} {key[1]} kv {key[2][0][0] if key[2] else ()}" for key in set(programs.compiled) - known)
        episodes.append({"compiled": compiles["n"] - before_episode, "work_per_step": per_step, "actions": actions,
                         "new_programs": new})
    return {"code": str(Path(agent_shell.__file__).resolve().parents[1]), "episodes": episodes,
            "programs": len(programs.compiled)}


def run_leg(root: Path, spec_file: Path, steps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root), TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               CB_AGENT_CACHE=str(spec_file.parent / "cache"))
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--leg", str(spec_file), "--steps",
                          str(steps)], env=env, capture_output=True, text=True, cwd=str(root))
    if out.returncode != 0:
        raise SystemExit(f"leg of {root} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default=None, help="the other checkout's root (default: this checkout alone)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--context-tokens", type=int, default=400)
    parser.add_argument("--out", default=None)
    parser.add_argument("--leg", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.leg:
        print(json.dumps(leg(json.loads(Path(args.leg).read_text()), args.steps)))
        return 0
    from host_share import build_inputs

    roots = {"this": HERE.parent, **({"base": Path(args.base).resolve()} if args.base else {})}
    figures: dict = {"steps": args.steps, "dtype": "float32", "backend": "jax", "machine": machine(),
                     "token_macs": TOKEN_MACS, "head_macs": HEAD_MACS}
    with tempfile.TemporaryDirectory() as tmp:
        spec = build_inputs(Path(tmp) / "model", args.vocab, args.width, args.context_tokens, 30)
        spec_file = Path(tmp) / "episode.json"
        spec_file.write_text(json.dumps(spec))
        for name, root in roots.items():
            out = run_leg(root, spec_file, args.steps)
            first, second = out["episodes"]
            figures[name] = {"compiled_first_episode": first["compiled"], "compiled_second_episode": second["compiled"],
                             "new_programs": [first["new_programs"], second["new_programs"]],
                             "programs": out["programs"],
                             "work_per_step": sum(first["work_per_step"] + second["work_per_step"])
                             / (2 * args.steps), "actions": first["actions"] + second["actions"]}
            print(f"{name}: compiled {first['compiled']} programs in the first episode, {second['compiled']} in "
                  f"the second; padded work {figures[name]['work_per_step']:.4g} multiply-adds a step", flush=True)
    verdicts = [f"first episode compiles {figures['this']['compiled_first_episode']} (target <= {TARGET_FIRST}), "
                f"the second {figures['this']['compiled_second_episode']} (target 0)"]
    if "base" in figures:
        figures["work_ratio"] = figures["this"]["work_per_step"] / figures["base"]["work_per_step"]
        figures["same_actions"] = figures["this"]["actions"] == figures["base"]["actions"]
        verdicts.append(f"padded work per step, this / base: {figures['work_ratio']!r} (target <= {TARGET_RATIO}); "
                        f"same actions: {figures['same_actions']}")
    for v in verdicts:
        print(v)
    figures["summary"] = verdicts
    return report(figures, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
