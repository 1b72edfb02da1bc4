"""How far a decision moves between a cold and a cached context, per backend and dtype, and how far
each is from the float32 decision.

For each backend (``torch``, ``jax``) and dtype (float32, bfloat16) on the default backbone
(SmolLM2-135M, CPU): score and decide the same context twice on one backend (the first call cold,
the second over the cached prefix) and once on a fresh backend; print the largest moves of log q,
of the hidden states (relative) and of log P under a fixed random concept (alpha ~ N(0, 0.3^2),
seed 1), and each bfloat16 decision's distance from the float32 one. JSON on stdout.

    python benchmarks/cold_cached_scores.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "lm"))  # the scoring tests' context


def main() -> None:
    import cb_core
    from agent_shell.lm import load_language_model
    from agent_shell.lm.decision import decide
    from test_lm_scoring import ALFWORLD_CANDIDATES, PREFIX, make_context

    context, out = make_context(3), {}
    for backend in ("jax", "torch"):
        for dtype in ("float32", "bfloat16"):
            load = lambda: load_language_model("jax:" if backend == "jax" else None, dtype=dtype, device="cpu")  # noqa: E731
            lm = load()
            s_cold, s_cached = (lm.score(context, ALFWORLD_CANDIDATES, PREFIX) for _ in range(2))
            s_fresh = load().score(context, ALFWORLD_CANDIDATES, PREFIX)
            lm = load()
            alpha = np.random.default_rng(1).standard_normal(lm.hidden_size + 1).astype(np.float32) * 0.3
            concept = cb_core.Concept(alpha, 0.8, 1e-6, {})
            head = concept.decision_head
            d_cold, d_cached = (decide(lm, context, ALFWORLD_CANDIDATES, PREFIX, head) for _ in range(2))
            h = np.asarray(s_cold.hidden, np.float64)
            out[f"{backend}-{dtype}"] = {
                "log_q_move_cached": float(np.abs(np.asarray(s_cached.log_q) - np.asarray(s_cold.log_q)).max()),
                "hidden_move_cached_relative": float(np.abs(np.asarray(s_cached.hidden, np.float64) - h).max()
                                                     / np.abs(h).max()),
                "log_q_move_fresh_backend": float(np.abs(np.asarray(s_fresh.log_q) - np.asarray(s_cold.log_q)).max()),
                "log_p_move_cached": float(np.abs(np.asarray(d_cold.log_p) - np.asarray(d_cached.log_p)).max()),
                "log_p_cold": np.asarray(d_cold.log_p, np.float64).tolist(),
                "log_p_cached": np.asarray(d_cached.log_p, np.float64).tolist()}
    for backend in ("jax", "torch"):
        ref = np.asarray(out[f"{backend}-float32"]["log_p_cold"])
        for which in ("cold", "cached"):
            out[f"{backend}-bfloat16"][f"log_p_{which}_from_float32"] = float(
                np.abs(np.asarray(out[f"{backend}-bfloat16"][f"log_p_{which}"]) - ref).max())
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
