"""Agreement (and speed) of the vLLM backend against the HuggingFace backend on one model (GPU only).

The vLLM backend (:mod:`agent_shell.lm.vllm_backend`) is UNVERIFIED until this check has passed
on a GPU. It scores the same ALFWorld-style contexts and candidate sets with both backends and
reports, per candidate, |log_q(vllm) - log_q(hf)| in nats, the hidden state's relative error
(max |difference| / max |hf|), whether the prior's argmax (log_q / n_tokens**0.8) agrees, whether
greedy routing replies agree, and seconds per scoring call of each. Tolerances (stated, not
tuned): float32 1e-3 nats and 1e-3 relative; bfloat16/float16 0.15 nats and 0.05 relative (half
precision kernels differ between the two engines). Exit code 1 when a tolerance is exceeded.

    .venv/bin/python benchmarks/vllm_agreement.py --dtype float32 --out /tmp/vllm_agreement.json
    .venv/bin/python benchmarks/vllm_agreement.py --model /models/Qwen3-4B --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOLERANCE = {"float32": (1e-3, 1e-3), "bfloat16": (0.15, 0.05), "float16": (0.15, 0.05)}
CANDIDATES = ["go to countertop 1", "take mug 2 from cabinet 3", "move apple 1 to fridge 1", "open microwave 1",
              "heat egg 1 with microwave 1", "examine desk 2", "go to cabinet 14"]
STEP = ("> go to cabinet {i}\nYou arrive at cabinet {i}. The cabinet {i} is open. In it, you see a mug {j}, "
        "a saltshaker {k}, and a dishsponge {i}.")


def contexts(n: int) -> list[str]:
    head = ("You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 1, "
            "a fridge 1 and a microwave 1.\nYour task is to: put a clean mug in coffeemachine.")
    return [head + "".join("\n" + STEP.format(i=i, j=i + 1, k=i + 2) for i in range(steps))
            for steps in np.linspace(0, 30, n).astype(int)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: the offline SmolLM2)")
    parser.add_argument("--dtype", default="float32", choices=sorted(TOLERANCE))
    parser.add_argument("--contexts", type=int, default=6)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--out", default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU: the vllm backend cannot be checked here", file=sys.stderr)
        return 2
    from agent_shell.context import action_prefix
    from agent_shell.lm import load_language_model

    hf = load_language_model(args.model, dtype=args.dtype, device="cuda")
    vl = load_language_model(f"vllm:{args.model or 'default'}", dtype=args.dtype,
                             gpu_memory_utilization=args.gpu_memory_utilization)
    prefix = action_prefix("text")
    dq, dh, agree, t_hf, t_vl = [], [], [], 0.0, 0.0
    for ctx in contexts(args.contexts):
        t = time.perf_counter()
        a = hf.score(ctx, CANDIDATES, prefix)
        t_hf += time.perf_counter() - t
        t = time.perf_counter()
        b = vl.score(ctx, CANDIDATES, prefix)
        t_vl += time.perf_counter() - t
        assert np.array_equal(a.n_tokens, b.n_tokens), "token accounting differs"
        dq.extend(np.abs(a.log_q - b.log_q).tolist())
        dh.extend((np.abs(a.hidden - b.hidden).max(1) / np.abs(a.hidden).max(1)).tolist())
        prior = lambda s: s.log_q / s.n_tokens ** 0.8  # noqa: E731
        agree.append(int(np.argmax(prior(a)) == np.argmax(prior(b))))
    routes = [(hf.generate(c + "\n>", max_new_tokens=16, stop=("\n",)),
               vl.generate(c + "\n>", max_new_tokens=16, stop=("\n",))) for c in contexts(3)]
    tol_q, tol_h = TOLERANCE[args.dtype]
    figures = {"model": hf.name, "dtype": args.dtype, "gpu": torch.cuda.get_device_name(0),
               "max_abs_dlog_q_nats": max(dq), "mean_abs_dlog_q_nats": float(np.mean(dq)),
               "max_rel_hidden_err": max(dh), "argmax_agreement": f"{sum(agree)}/{len(agree)}",
               "greedy_route_agreement": f"{sum(x == y for x, y in routes)}/{len(routes)}",
               "s_per_score_hf": t_hf / len(agree), "s_per_score_vllm": t_vl / len(agree),
               "tolerance_nats": tol_q, "tolerance_rel_hidden": tol_h}
    figures["passed"] = bool(max(dq) <= tol_q and max(dh) <= tol_h)
    print(json.dumps(figures, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1))
    return 0 if figures["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
