"""Several requests' candidate sets in one forward pass give the numbers of one score() call each
(fp32, 1e-4 nats), whatever their context lengths, and keep each stream's cache."""

from __future__ import annotations

import numpy as np

from agent_shell.context import action_prefix
from agent_shell.lm.batched import ScoreRequest, score_many
from agent_shell.lm.kv_cache import HeadStore, PrefixCache
from agent_shell.lm.torch_kv import TransformersKV

PREFIX = action_prefix("text")
STEP = "> go to cabinet {i}\nYou arrive at cabinet {i}. In it, you see a mug {j} and a dishsponge {i}."


def context(task: str, n: int) -> str:
    return f"You are in a room.\nYour task is to: {task}." + "".join("\n" + STEP.format(i=i, j=i + 1) for i in range(n))


REQUESTS = [
    (context("put a mug in cabinet", 0), ["go to countertop 1", "take mug 2 from cabinet 3", "look"]),
    (context("heat an egg", 6), ["heat egg 1 with microwave 1", "open fridge 1"]),
    # shared token prefixes and a duplicate: the prefix tree merges them
    (context("put a mug in cabinet", 2), ["examine desk 2", "go to cabinet 14", "café ☕", "!bang.", "go to cabinet 1",
                                          "go to cabinet 14", "examine desk 1"]),
    (context("clean a plate", 11), ["clean plate 1 with sinkbasin 1"]),
]


def test_one_pass_for_all_requests_equals_one_call_each(lm32, fresh):
    # the reference: one call each with right-padded rows (no packing, no prefix tree)
    ref = [fresh(reuse_cache=False, candidate_layout="batched").score(c, cands, PREFIX) for c, cands in REQUESTS]
    heads = HeadStore()
    streams = [PrefixCache(TransformersKV(lm32.model, lm32.device), True, heads) for _ in REQUESTS]
    calls = []
    lm = fresh()
    real = lm._forward
    lm._forward = lambda *a, **k: calls.append(a[0].shape) or real(*a, **k)
    for step in range(2):  # the second round finds every stream's context cached
        before = len(calls)
        got = score_many(lm, [ScoreRequest(s, c + "\n> look" * step, tuple(cands), PREFIX)
                              for s, (c, cands) in zip(streams, REQUESTS)])
        batched = [shape for shape in calls[before:] if shape[0] == len(REQUESTS)]
        assert len(batched) == 1  # all candidate sets in one pass
        if step == 0:
            for g, r in zip(got, ref):
                assert np.array_equal(g.n_tokens, r.n_tokens)
                assert np.abs(g.log_q - r.log_q).max() < 1e-4, (g.log_q, r.log_q)
                assert np.abs(g.hidden - r.hidden).max() / np.abs(r.hidden).max() < 1e-4
    for s, (c, _) in zip(streams, REQUESTS):
        assert len(s.ids) > len(lm.encode(c)) - 2  # each stream kept its own context
    second = [fresh(reuse_cache=False).score(c + "\n> look", cands, PREFIX) for c, cands in REQUESTS]
    for g, r in zip(got, second):
        assert np.abs(g.log_q - r.log_q).max() < 1e-4


GENERATIONS = [  # (prompt, max_new_tokens, stop, temperature, seed)
    (context("put a mug in cabinet", 0) + "\n>", 12, (), 0.0, None),
    (context("heat an egg", 6) + "\n>", 20, ("\n",), 0.0, None),
    (context("clean a plate", 11) + "\n>", 16, (), 0.7, 3),
    ([{"role": "user", "content": "Name a colour."}], 8, (".",), 0.0, None),
    (context("heat an egg", 1) + "\n>", 0, (), 0.0, None),
]


def test_replies_decoded_together_equal_one_generate_call_each(fresh):
    from agent_shell.lm.batched import GenerateRequest, generate_many

    ref = [fresh(reuse_cache=False).generate(p, n_new, stop, temp, 1, seed) for p, n_new, stop, temp, seed in GENERATIONS]
    lm = fresh()
    streams = [PrefixCache(TransformersKV(lm.model, lm.device), True, HeadStore()) for _ in GENERATIONS]
    calls = []
    real = lm._forward
    lm._forward = lambda *a, **k: calls.append(a[0].shape) or real(*a, **k)
    got = generate_many(lm, [GenerateRequest(s, p, n_new, stop, temp, seed)
                             for s, (p, n_new, stop, temp, seed) in zip(streams, GENERATIONS)])
    assert got == [r[0] for r in ref]
    assert got[-1] == "" and got[0] and "\n" not in got[1]
    live = len(GENERATIONS) - 1  # the zero-budget request decodes nothing
    decode_passes = [shape for shape in calls if shape == (live, 1)]
    assert 1 <= len(decode_passes) <= max(n for _, n, *_ in GENERATIONS) - 1
    # prompts one by one (several tokens each), then every token of every row in the shared passes
    assert all(shape == (live, 1) or (shape[0] == 1 and shape[1] > 1) for shape in calls)
    for s, (p, n_new, *_) in zip(streams, GENERATIONS):  # each stream keeps its prompt's cache
        if n_new:
            assert s.ids == tuple(lm.encode(*lm.formatter.rendered(p)))
