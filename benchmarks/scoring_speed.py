"""Candidate-scoring speed: naive and batched re-encoding vs. the cached backend vs. the floor.

For contexts of 512 and 2,048 tokens and 10 and 30 realistic ALFWorld actions, one run times,
side by side on the same model, dtype and machine:

* ``naive``: one forward over context + candidate per candidate, logits at every position (as
  lm-evaluation-harness's ``loglikelihood`` does; the log-softmax is taken only over the
  continuation, which is kinder to this baseline than the harness is);
* ``batched``: all M context + candidate sequences in one left-padded batch, logits only at the
  last positions (a strong re-encoding baseline);
* ``backend``: :meth:`HFLanguageModel.score` from a cold cache (context encoded once, all
  candidates packed in one pass); ``backend-batched``: the same with right-padded candidate rows;
  ``backend-warm``: the next step of an episode (context extended by one action and observation,
  prefix cache reused);
* ``floor``: one forward over the context followed by all candidates' tokens as a single
  sequence, logits only at the candidate positions: the least compute any exact method needs.

Reported: median seconds over ``--repeats`` (``--slow-repeats`` for the slow baselines; the fast
methods are timed round-robin so that they share the load of a shared machine), effective tokens per
second (context + all candidate tokens, the same numerator for every method), peak memory above
the pre-call level (resident set on CPU, allocator peak on CUDA), and the largest log-prob gap to
``naive`` (bf16 makes that gap nonzero). Targets (issue 2): ``backend`` >= 5x faster than
``batched`` at 30 candidates after 2,048 tokens, and within 1.5x of ``floor``.

Results are written atomically to ``--out`` (JSON) after each configuration; ``--resume`` skips
configurations already there.

    .venv/bin/python benchmarks/scoring_speed.py --out /tmp/scoring_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_shell.context import action_prefix  # noqa: E402
from agent_shell.lm import load_language_model  # noqa: E402
from agent_shell.lm.hf import HFLanguageModel  # noqa: E402

PREFIX = action_prefix("text")  # the transcript's "\n> "

ACTIONS = [
    "go to countertop 1", "go to cabinet 3", "go to fridge 1", "go to microwave 1", "go to sinkbasin 1",
    "go to stoveburner 2", "go to diningtable 1", "go to drawer 4", "go to coffeemachine 1", "go to garbagecan 1",
    "take mug 2 from cabinet 3", "take apple 1 from countertop 1", "take knife 1 from drawer 4",
    "move apple 1 to fridge 1", "move mug 2 to coffeemachine 1", "move potato 3 to microwave 1",
    "open fridge 1", "close fridge 1", "open microwave 1", "open drawer 4", "close cabinet 3",
    "heat potato 3 with microwave 1", "cool apple 1 with fridge 1", "clean mug 2 with sinkbasin 1",
    "slice bread 1 with knife 1", "use desklamp 1", "examine mug 2", "examine countertop 1",
    "inventory", "look",
]
STEP = (
    "> go to {r} {i}\nOn the {r} {i}, you see a {o} {j}, a {o2} {k}, and a {o3} {i}.\n"
    "> take {o} {j} from {r} {i}\nYou pick up the {o} {j} from the {r} {i}.\n"
    "> think: Now I need to put the {o} {j} somewhere. First I check the {r2} {k}.\nOK.\n"
)
RECEPS = ["countertop", "cabinet", "drawer", "shelf", "sinkbasin", "fridge", "diningtable", "stoveburner"]
OBJECTS = ["mug", "apple", "potato", "knife", "spatula", "saltshaker", "egg", "bread", "plate", "cup"]


def make_context(lm: HFLanguageModel, n_tokens: int) -> str:
    """A ReAct-style ALFWorld transcript cut to ``n_tokens`` tokens (to within a token or two)."""
    text = (
        "Interact with a household to solve a task.\nYou are in the middle of a room. Looking quickly "
        "around you, you see a cabinet 1, a countertop 1, a drawer 4, a fridge 1 and a microwave 1.\n"
        "Your task is to: put a cool apple in microwave.\n"
    )
    i = 0
    while len(lm.encode(text)) < n_tokens + 8:
        text += STEP.format(
            r=RECEPS[i % 8], r2=RECEPS[(i + 3) % 8], o=OBJECTS[i % 10], o2=OBJECTS[(i + 4) % 10],
            o3=OBJECTS[(i + 7) % 10], i=i % 5 + 1, j=i % 3 + 1, k=i % 4 + 1,
        )
        i += 1
    ids = lm.encode(text)[:n_tokens]
    return lm.tokenizer.decode(ids).rstrip() + "\nOn the countertop 1, you see an apple 1."


class PeakMemory:
    """Peak memory above the level at entry: allocator peak on CUDA, sampled RSS on CPU (MiB)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.peak_mib = 0.0

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self) -> "PeakMemory":
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._start = torch.cuda.memory_allocated()
        else:
            self._start = self._rss()
            self._peak = self._start
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, self._rss())
            time.sleep(0.002)

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        else:
            self._stop.set()
            self._thread.join()
            peak = max(self._peak, self._rss())
        self.peak_mib = (peak - self._start) / 2**20


def _tokens(lm: HFLanguageModel, context: str, candidates: list[str]):
    return lm.tokenize_continuations(lm.render(context, PREFIX), candidates)


@torch.inference_mode()
def naive(lm: HFLanguageModel, context: str, candidates: list[str]) -> np.ndarray:
    out = []
    for t in _tokens(lm, context, candidates):
        logits = lm.model(torch.tensor([t.ids], device=lm.device)).logits[0]  # every position
        logp = torch.log_softmax(logits[t.first - 1 : -1].float(), dim=-1)
        out.append(logp.gather(1, torch.tensor(t.ids[t.first :], device=lm.device)[:, None]).sum().item())
    return np.array(out)


@torch.inference_mode()
def batched(lm: HFLanguageModel, context: str, candidates: list[str]) -> np.ndarray:
    toks = _tokens(lm, context, candidates)
    width = max(len(t.ids) for t in toks)
    ids = torch.zeros(len(toks), width, dtype=torch.long)
    mask = torch.zeros(len(toks), width, dtype=torch.long)
    for m, t in enumerate(toks):  # left padding: every sequence ends in the last column
        ids[m, width - len(t.ids) :] = torch.tensor(t.ids)
        mask[m, width - len(t.ids) :] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    keep = max(t.n_action for t in toks) + 1
    logits = lm.model(
        input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device), position_ids=pos.to(lm.device),
        logits_to_keep=keep,
    ).logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    out = []
    for m, t in enumerate(toks):
        rows = torch.arange(keep - 1 - t.n_action, keep - 1, device=lm.device)
        out.append(logp[m, rows].gather(1, torch.tensor(t.ids[t.first :], device=lm.device)[:, None]).sum().item())
    return np.array(out)


@torch.inference_mode()
def floor(lm: HFLanguageModel, context: str, candidates: list[str]) -> np.ndarray:
    toks = _tokens(lm, context, candidates)
    ctx = list(toks[0].ids[: toks[0].first])
    tail = [i for t in toks for i in t.ids[t.first :]]
    lm.model(torch.tensor([ctx + tail], device=lm.device), logits_to_keep=len(tail) + 1)
    return np.full(len(candidates), np.nan)


def backend_fn(lm: HFLanguageModel, layout: str) -> Callable:
    scorer = HFLanguageModel(lm.model, lm.tokenizer, name=lm.name, candidate_layout=layout, reuse_cache=False)
    return lambda context, candidates: scorer.score(context, candidates, PREFIX).log_q


def _timed(fn: Callable, lm, context, candidates, setup: Callable | None = None) -> tuple[float, float, np.ndarray]:
    if setup is not None:
        setup()
    with PeakMemory(lm.device) as mem:
        t0 = time.perf_counter()
        result = fn(context, candidates)
        if lm.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    return seconds, mem.peak_mib, np.asarray(result)


def measure_rounds(methods: dict, lm, context, candidates, repeats: int, warm_up: bool) -> dict:
    """Time each method ``repeats`` times, round-robin, so that all of them see the same load
    (the machines are shared); the median is reported. ``methods``: name -> (fn, setup or None)."""
    if warm_up:
        for fn, setup in methods.values():
            _timed(fn, lm, context, candidates, setup)
    runs: dict[str, list] = {name: [] for name in methods}
    for _ in range(repeats):
        for name, (fn, setup) in methods.items():
            runs[name].append(_timed(fn, lm, context, candidates, setup))
    return {
        name: {
            "seconds": statistics.median(r[0] for r in rs),
            "all_seconds": [r[0] for r in rs],
            "peak_mib": max(r[1] for r in rs),
            "log_q": rs[-1][2],
        }
        for name, rs in runs.items()
    }


def warm_step_method(lm: HFLanguageModel, context: str) -> tuple[Callable, Callable]:
    """The next step of an episode: the previous context (up to the last action) is cached
    untimed in ``setup``, then the full context is scored."""
    scorer = lm.fork()  # its own prefix cache
    head = context[: context.rindex("\n> ")]
    state = {}

    def setup() -> None:
        scorer.reset_cache()
        scorer.score(head, state["candidates"], PREFIX)

    def run(ctx: str, candidates: list[str]) -> np.ndarray:
        return scorer.score(ctx, candidates, PREFIX).log_q

    def setup_for(candidates: list[str]) -> Callable:
        state["candidates"] = candidates
        return setup

    return run, setup_for


def write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder or name (default: offline SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 only where the CPU has native kernels), bfloat16, float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--candidates", type=int, nargs="+", default=[10, 30])
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the fast methods (median reported)")
    parser.add_argument("--slow-repeats", type=int, default=1, help="repeats of naive and batched re-encoding")
    parser.add_argument("--out", type=Path, default=Path("scoring_speed.json"))
    parser.add_argument("--resume", action="store_true", help="skip configurations already in --out")
    parser.add_argument("--fast-only", action="store_true",
                        help="re-time only the fast methods of configurations in --out, keeping its naive/batched rows")
    args = parser.parse_args(argv)

    lm = load_language_model(args.model, dtype=args.dtype, device=args.device)
    data = json.loads(args.out.read_text()) if (args.resume or args.fast_only) and args.out.is_file() else {}
    data["setup"] = {
        "model": lm.name, "dtype": lm.metadata["dtype"], "device": str(lm.device), "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(), "load_average_at_start": os.getloadavg(), "torch": torch.__version__,
    }
    results = data.setdefault("results", {})
    for n_ctx in args.contexts:
        context = make_context(lm, n_ctx)
        for n_cand in args.candidates:
            key = f"ctx{n_ctx}_cand{n_cand}"
            if key in results and not args.fast_only:
                continue
            candidates = ACTIONS[:n_cand]
            toks = _tokens(lm, context, candidates)
            n_context = toks[0].first
            n_action = sum(t.n_action for t in toks)
            effective = n_context + n_action
            old = results.get(key) if args.fast_only else None
            if old is not None:  # keep the slow baselines measured before
                rows = {n: dict(old["methods"][n], log_q=np.array(old["methods"][n]["log_q"])) for n in ("naive", "batched")}
            else:
                rows = measure_rounds(
                    {"naive": (lambda c, a: naive(lm, c, a), None), "batched": (lambda c, a: batched(lm, c, a), None)},
                    lm, context, candidates, args.slow_repeats, warm_up=False,
                )
            warm_run, warm_setup = warm_step_method(lm, context)
            rows.update(measure_rounds(
                {
                    "backend": (backend_fn(lm, "packed"), None),
                    "backend-batched": (backend_fn(lm, "batched"), None),
                    "floor": (lambda c, a: floor(lm, c, a), None),
                    "backend-warm": (warm_run, warm_setup(candidates)),
                },
                lm, context, candidates, args.repeats, warm_up=True,
            ))
            for name, row in rows.items():
                print(f"  {key} {name:16s} {row['seconds']:8.3f} s", file=sys.stderr, flush=True)
            ref = rows["naive"]["log_q"]
            for row in rows.values():
                row["tokens_per_s"] = effective / row["seconds"]
                row["max_abs_log_q_gap_to_naive"] = (
                    None if np.isnan(row["log_q"]).all() else float(np.abs(row["log_q"] - ref).max())
                )
                row["log_q"] = [float(x) for x in row["log_q"]]
            results[key] = {
                "context_tokens": n_context, "candidates": n_cand, "candidate_tokens": n_action,
                "load_average": os.getloadavg(), "methods": rows,
                "speedup_vs_batched": rows["batched"]["seconds"] / rows["backend"]["seconds"],
                "speedup_vs_naive": rows["naive"]["seconds"] / rows["backend"]["seconds"],
                "ratio_to_floor": rows["backend"]["seconds"] / rows["floor"]["seconds"],
            }
            write_atomic(args.out, data)
    print(report(data))
    return 0


def report(data: dict) -> str:
    s = data["setup"]
    lines = [
        f"model {s['model']}, {s['dtype']} on {s['device']} ({s['torch_threads']} torch threads, "
        f"{s['cpu_count']} CPUs, load average at start {s['load_average_at_start'][0]:.1f})",
        "| config | method | seconds | tokens/s | peak MiB | max |dlog q| vs naive |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for key, r in data["results"].items():
        for name, row in r["methods"].items():
            gap = row["max_abs_log_q_gap_to_naive"]
            lines.append(
                f"| {key} | {name} | {row['seconds']:.3f} | {row['tokens_per_s']:.0f} | {row['peak_mib']:.0f} | "
                f"{'-' if gap is None else f'{gap:.2e}'} |"
            )
    for key, r in data["results"].items():
        lines.append(
            f"{key} ({r['context_tokens']} context + {r['candidate_tokens']} candidate tokens): backend is "
            f"{r['speedup_vs_naive']:.1f}x faster than naive, {r['speedup_vs_batched']:.1f}x faster than batched "
            f"re-encoding, {r['ratio_to_floor']:.2f}x the floor"
        )
    target = data["results"].get("ctx2048_cand30")
    if target:
        ok = target["speedup_vs_batched"] >= 5 and target["ratio_to_floor"] <= 1.5
        lines.append(f"target (>= 5x vs batched, <= 1.5x floor at 2048/30): {'MET' if ok else 'NOT MET'}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
