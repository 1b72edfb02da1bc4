"""Candidate-scoring speed: naive and batched re-encoding, cached context + batched candidates,
the cached packed backend, and the one-forward floor, side by side; plus bfloat16 vs float32.

For contexts of 512 and 2,048 tokens and 10 and 30 realistic ALFWorld actions, one run times, on
the same model and machine:

* ``naive``: one forward over context + candidate per candidate, logits at every position (as
  lm-evaluation-harness's ``loglikelihood`` does; the log-softmax is taken only over the
  continuation, which is kinder to this baseline than the harness is);
* ``batched``: all M context + candidate sequences in one left-padded batch, logits only at the
  last positions (re-encoding, but batched);
* ``backend-batched``: :meth:`HFLanguageModel.score` with ``candidate_layout="batched"``: the
  context encoded once into a KV cache, then the M candidates as right-padded rows over that
  cache (the strongest fair baseline: what a careful implementation without packing does);
* ``backend``: :meth:`HFLanguageModel.score` with ``candidate_layout="packed"``: context encoded
  once, all candidates packed into one row with a block-diagonal mask (the default layout,
  ``"tree"``, also merges shared token prefixes: fewer tokens on real candidate sets, timed
  against ``packed`` on recorded ALFWorld steps by ``benchmarks/step_cost.py``);
* ``floor``: one forward over the context followed by all candidates' tokens as a single
  sequence, logits only at the candidate positions: the least compute any exact method needs;
* ``backend-warm``: not a baseline but the next step of an episode (the previous context, up to
  the last action, is cached untimed before each call; the prefix cache is reused);
* ``backend@<dtype>``: ``backend`` with the same weights in another dtype (``--compare-dtype``,
  default the other of bfloat16/float32), for the dtype rule of :mod:`agent_shell.lm.dtypes`;
* with ``--backend jax``: ``jax`` and ``jax-warm``, the JAX backend
  (:mod:`agent_shell.lm.jax_backend`, the same folder's weights in the same dtype) doing what
  ``backend`` and ``backend-warm`` do, in the same rotation; ``jax_time_over_backend`` and
  ``jax-warm_time_over_backend-warm`` are its time over the PyTorch backend's (target: at most 1
  in float32). Each configuration's first JAX call compiles its programs: that is the untimed
  warm-up (a new process loads them from the executable store when it is on). ``--dots`` times
  the backbone's matrix products alone, XLA against torch, one thread each (where the JAX
  backend's time goes).

All methods are timed the same way, in one interleaved phase: one untimed warm-up call each,
then ``--rounds`` rounds, each calling every method once, in an order rotated by one place per
round (so no method always runs first or after the same neighbour on a shared machine); the
median is reported. ``backend`` and the cold methods start from an empty cache every call.
Reported per method: median seconds, all seconds, effective tokens per second (context + all
candidate tokens, the same numerator for every method), peak memory above the pre-call level
(resident set on CPU, allocator peak on CUDA), and the largest log-prob gap to ``naive`` in the
primary dtype. Each ratio in the summary names its baseline. Targets: ``backend`` >= 5x
faster than ``batched`` at 30 candidates after 2,048 tokens, and within 1.5x of ``floor``.

Results are written atomically to ``--out`` (JSON) after each configuration; ``--resume`` skips
configurations already there (from a run with the same setup). ``--fast-only`` leaves out
``naive`` and ``batched`` (then no ratio to them is reported; nothing is reused from earlier runs).
``--tiny`` runs one tiny configuration, one round (a smoke test, not a measurement).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/scoring_speed.py --out /tmp/scoring_speed.json
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _targets import cpu_flags, verdict, verdict_line  # noqa: E402

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


def backend_fn(lm, layout: str) -> Callable:
    """``score``'s log_q by a view of ``lm`` (either backend) with ``layout`` and no cache reuse."""
    if isinstance(lm, HFLanguageModel):
        scorer = HFLanguageModel(lm.model, lm.tokenizer, name=lm.name, candidate_layout=layout, reuse_cache=False)
    else:
        from agent_shell.lm.jax_backend import JaxLanguageModel

        scorer = JaxLanguageModel(lm.decoder, lm.tokenizer, name=lm.name, candidate_layout=layout, reuse_cache=False)
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


def rotated(names: list[str], round_index: int) -> list[str]:
    """``names`` rotated left by ``round_index`` places (round 0: as given)."""
    k = round_index % len(names)
    return names[k:] + names[:k]


def measure(methods: dict, context: str, candidates: list[str], rounds: int) -> dict:
    """Time every method the same way: one untimed warm-up call each, then ``rounds`` rounds of
    one call per method in rotating order; the median is reported.

    ``methods``: name -> (fn, lm it runs on, setup or None); ``setup`` runs untimed before each call.
    """
    names = list(methods)
    for name in names:  # warm-up: first-call allocations, kernel selection
        fn, lm, setup = methods[name]
        _timed(fn, lm, context, candidates, setup)
    runs: dict[str, list] = {name: [] for name in names}
    for r in range(rounds):
        for name in rotated(names, r):
            fn, lm, setup = methods[name]
            runs[name].append(_timed(fn, lm, context, candidates, setup))
    return {
        name: {
            "seconds": statistics.median(x[0] for x in rs),
            "all_seconds": [x[0] for x in rs],
            "peak_mib": max(x[1] for x in rs),
            "log_q": rs[-1][2],
        }
        for name, rs in runs.items()
    }


def warm_step_method(lm: HFLanguageModel, context: str, candidates: list[str]) -> tuple[Callable, Callable]:
    """The next step of an episode: (run, setup); ``setup`` caches the previous context (up to
    the last action) untimed, ``run`` scores the full context."""
    scorer = lm.fork()  # its own prefix cache
    head = context[: context.rindex("\n> ")]

    def setup() -> None:
        scorer.reset_cache()
        scorer.score(head, candidates, PREFIX)

    def run(ctx: str, cands: list[str]) -> np.ndarray:
        return scorer.score(ctx, cands, PREFIX).log_q

    return run, setup


def write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


OTHER_DTYPE = {"bfloat16": "float32", "float32": "bfloat16"}
#: setup fields a --resume must match
SAME_SETUP = ("model", "dtype", "compare_dtypes", "device", "torch_threads", "rounds", "fast_only", "backend")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder or name (default: offline SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", default="auto", help="dtype of every method (auto: agent_shell.lm.dtypes rule)")
    parser.add_argument("--compare-dtype", nargs="*", default=None,
                        help="dtypes in which `backend` is also timed (default: the other of bfloat16/float32)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--candidates", type=int, nargs="+", default=[10, 30])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-up (median reported)")
    parser.add_argument("--out", type=Path, default=Path("scoring_speed.json"))
    parser.add_argument("--resume", action="store_true", help="skip configurations already in --out")
    parser.add_argument("--fast-only", action="store_true", help="leave out naive and batched re-encoding")
    parser.add_argument("--tiny", action="store_true", help="smoke test: one 96-token context, 3 candidates, 1 round")
    parser.add_argument("--backend", choices=("torch", "jax"), default="torch",
                        help="jax: also time the JAX backend (jax, jax-warm) beside the PyTorch one")
    parser.add_argument("--dots", action="store_true",
                        help="only time the backbone's matrix products alone, XLA against torch (where the JAX "
                             "backend's time goes), and print them")
    args = parser.parse_args(argv)
    if args.dots:
        print(json.dumps(dot_products(args.model), indent=1))
        return 0
    if args.tiny:
        args.contexts, args.candidates, args.rounds = [96], [3], 1

    lm = load_language_model(args.model, dtype=args.dtype, device=args.device)
    dtype = lm.metadata["dtype"]
    compare = args.compare_dtype if args.compare_dtype is not None else [OTHER_DTYPE.get(dtype, "float32")]
    others = {d: load_language_model(args.model, dtype=d, device=args.device) for d in compare if d != dtype}
    jax_lm = (load_language_model(f"jax:{args.model or ''}", dtype=dtype, device=args.device)
              if args.backend == "jax" else None)
    setup = {
        "model": lm.name, "dtype": dtype, "compare_dtypes": sorted(others), "device": str(lm.device),
        "torch_threads": torch.get_num_threads(), "rounds": args.rounds, "fast_only": args.fast_only,
        "backend": args.backend,
        "cpu_count": os.cpu_count(), "cpu_flags": cpu_flags(), "torch": torch.__version__,
        "load_average_at_start": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    data = json.loads(args.out.read_text()) if args.resume and args.out.is_file() else {}
    if data and any(data["setup"].get(k) != setup[k] for k in SAME_SETUP):
        raise SystemExit(f"--resume: {args.out} was measured with another setup "
                         f"({ {k: data['setup'].get(k) for k in SAME_SETUP} }); use another --out")
    data.setdefault("setup", setup)
    results = data.setdefault("results", {})
    for n_ctx in args.contexts:
        context = make_context(lm, n_ctx)
        for n_cand in args.candidates:
            key = f"ctx{n_ctx}_cand{n_cand}"
            if key in results:
                continue
            candidates = ACTIONS[:n_cand]
            toks = _tokens(lm, context, candidates)
            n_context = toks[0].first
            n_action = sum(t.n_action for t in toks)
            methods: dict[str, tuple] = {}
            if not args.fast_only:
                methods["naive"] = (lambda c, a: naive(lm, c, a), lm, None)
                methods["batched"] = (lambda c, a: batched(lm, c, a), lm, None)
            methods["backend-batched"] = (backend_fn(lm, "batched"), lm, None)
            methods["backend"] = (backend_fn(lm, "packed"), lm, None)
            methods["floor"] = (lambda c, a: floor(lm, c, a), lm, None)
            warm_run, warm_setup = warm_step_method(lm, context, candidates)
            methods["backend-warm"] = (warm_run, lm, warm_setup)
            for d, other in others.items():
                methods[f"backend@{d}"] = (backend_fn(other, "packed"), other, None)
            if jax_lm is not None:  # timed on the PyTorch model's device for the memory probe: the same one
                methods["jax"] = (backend_fn(jax_lm, "packed"), lm, None)
                jax_warm, jax_warm_setup = warm_step_method(jax_lm, context, candidates)
                methods["jax-warm"] = (jax_warm, lm, jax_warm_setup)
            rows = measure(methods, context, candidates, args.rounds)
            for name, row in rows.items():
                print(f"  {key} {name:18s} {row['seconds']:8.3f} s", file=sys.stderr, flush=True)
            ref = rows["naive"]["log_q"] if "naive" in rows else None
            for row in rows.values():
                row["tokens_per_s"] = (n_context + n_action) / row["seconds"]
                row["max_abs_log_q_gap_to_naive"] = (
                    None if ref is None or np.isnan(row["log_q"]).all() else float(np.abs(row["log_q"] - ref).max())
                )
                row["log_q"] = [float(x) for x in row["log_q"]]
            results[key] = {
                "context_tokens": n_context, "candidates": n_cand, "candidate_tokens": n_action,
                "load_average": os.getloadavg(), "methods": rows,
                "ratios": ratios(rows),
            }
            write_atomic(args.out, data)
    print(report(data))
    return 0


def dot_products(model: str | None, rounds: int = 7) -> dict:
    """The backbone's matrix products alone, float32, one thread each, each weight in
    transformers' [out, in] layout as both backends hold it: the JAX decoder's own product
    (:func:`agent_shell.lm.jax_model._dot`, compiled by XLA) against torch's
    (``torch.nn.functional.linear``, as transformers runs it), for the rows of a warm step (96: its
    new tokens and candidates) and of a long first pass (2,304), through the attention
    projections, the MLP and the LM head; alternated, medians. Returns shape -> {"xla_s",
    "torch_s", "xla_over_torch"}."""
    import jax
    import jax.numpy as jnp

    from agent_shell.lm.default_model import default_model_dir
    from agent_shell.lm.jax_model import _dot, read_config

    c = read_config(model or default_model_dir())
    rng = np.random.default_rng(0)
    dot = jax.jit(lambda a, b: _dot(a, b, jax.lax.Precision.HIGHEST))
    out = {}
    for rows in (96, 2304):
        for name, k, n in (("q/o projection", c.hidden_size, c.num_heads * c.head_dim),
                           ("k/v projection", c.hidden_size, c.num_kv_heads * c.head_dim),
                           ("mlp gate/up", c.hidden_size, c.intermediate_size),
                           ("mlp down", c.intermediate_size, c.hidden_size),
                           ("lm head", c.hidden_size, c.vocab_size)):
            if name == "lm head" and rows > 96:
                continue  # the head reads only the rows that predict a token
            x, w = rng.normal(size=(rows, k)).astype(np.float32), rng.normal(size=(n, k)).astype(np.float32)
            jx, jw, tx, tw = jnp.asarray(x), jnp.asarray(w), torch.from_numpy(x), torch.from_numpy(w)
            calls = {"xla": lambda: dot(jx, jw).block_until_ready(),
                     "torch": lambda: torch.nn.functional.linear(tx, tw)}
            for call in calls.values():
                call()  # compiled, warmed
            times: dict[str, list[float]] = {"xla": [], "torch": []}
            for r in range(rounds):
                for which in rotated(list(calls), r):
                    t0 = time.perf_counter()
                    calls[which]()
                    times[which].append(time.perf_counter() - t0)
            xla, tor = statistics.median(times["xla"]), statistics.median(times["torch"])
            out[f"{rows} rows, {name} [{k} x {n}]"] = {"xla_s": xla, "torch_s": tor, "xla_over_torch": xla / tor}
    return out


#: (name, method, baseline, meaning): every ratio is baseline seconds / method seconds
RATIOS = [
    ("speedup_vs_naive", "backend", "naive", "naive re-encoding"),
    ("speedup_vs_batched", "backend", "batched", "batched re-encoding"),
    ("speedup_vs_cached_batched", "backend", "backend-batched", "cached context + batched candidates"),
]


def ratios(rows: dict) -> dict:
    """Every headline ratio whose two methods were measured in this run."""
    out = {}
    for name, method, base, _ in RATIOS:
        if method in rows and base in rows:
            out[name] = rows[base]["seconds"] / rows[method]["seconds"]
    out["ratio_to_floor"] = rows["backend"]["seconds"] / rows["floor"]["seconds"]
    for m in rows:
        if m.startswith("backend@"):
            out[f"{m}_time_over_backend"] = rows[m]["seconds"] / rows["backend"]["seconds"]
    for jax_name, torch_name in JAX_PAIRS:
        if jax_name in rows:
            out[f"{jax_name}_time_over_{torch_name}"] = rows[jax_name]["seconds"] / rows[torch_name]["seconds"]
    return out


#: (JAX method, the PyTorch method doing the same): their time ratio is reported
JAX_PAIRS = (("jax", "backend"), ("jax-warm", "backend-warm"))


def report(data: dict) -> str:
    s = data["setup"]
    flags = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in s.get("cpu_flags", {}).items())
    lines = [
        f"model {s['model']}, {s['dtype']} on {s['device']} ({s['torch_threads']} torch threads, "
        f"{s['cpu_count']} CPUs, load average at start {s['load_average_at_start'][0]:.1f}; {flags}); "
        f"{s['rounds']} rounds after a warm-up, medians",
        "| config | method | seconds | tokens/s | peak MiB | max abs dlog q vs naive |",
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
        m, q = r["methods"], r["ratios"]
        parts = [f"{meaning} ({base}) takes {q[name]!r}x its time ({m[base]['seconds']:.3f} s)"
                 for name, _, base, meaning in RATIOS if name in q]
        parts.append(f"it takes {q['ratio_to_floor']!r}x the time of the one-forward floor "
                     f"({m['floor']['seconds']:.3f} s)")
        lines.append(f"{key} ({r['context_tokens']} context + {r['candidate_tokens']} candidate tokens), "
                     f"{s['dtype']}: backend {m['backend']['seconds']:.3f} s; " + "; ".join(parts))
        for jax_name, torch_name in JAX_PAIRS:
            if jax_name in m:
                lines.append(f"{key}: the JAX backend's {jax_name} takes {q[f'{jax_name}_time_over_{torch_name}']!r}x "
                             f"the time of the PyTorch backend's {torch_name} ({s['dtype']})")
        for name in m:
            if name.startswith("backend@"):
                lines.append(f"{key}: backend in {name.removeprefix('backend@')} takes "
                             f"{q[f'{name}_time_over_backend']!r}x the time of backend in {s['dtype']}")
    lines.extend(verdict_line(v) for v in verdicts(data))
    return "\n".join(lines)


def verdicts(data: dict) -> list[dict]:
    """The targets at 2,048 context tokens and 30 candidates, compared unrounded: ``backend``
    >= 5x faster than batched re-encoding, and <= 1.5x the floor."""
    q = data["results"].get("ctx2048_cand30", {}).get("ratios", {})
    out = []
    if "speedup_vs_batched" in q:
        out += [verdict("batched re-encoding / backend at 2048/30", q["speedup_vs_batched"], 5.0, at_most=False),
                verdict("backend / floor at 2048/30", q["ratio_to_floor"], 1.5, at_most=True)]
    if data["setup"].get("dtype") == "float32":  # the JAX target is stated in float32
        for key, r in data["results"].items():
            for jax_name, torch_name in JAX_PAIRS:
                name = f"{jax_name}_time_over_{torch_name}"
                if name in r["ratios"]:
                    out.append(verdict(f"JAX {jax_name} / PyTorch {torch_name} at {key}", r["ratios"][name], 1.0,
                                       at_most=True))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
