"""Prefix reuse across episodes: pinned prompt heads give the numbers of the uncached path (fp32)
and encode only the tokens after the head."""

from __future__ import annotations

import numpy as np
import pytest

from agent_shell.context import action_prefix, react_head, react_prompt
from agent_shell.lm.kv_cache import HeadStore
from agent_shell.lm.tokenization import common_prefix_len

HEADER = "Interact with a household to solve a task. Here are {n_demos} examples."
DEMOS = {
    "pick": ["You are in the middle of a room.\nYour task is to: put a mug in cabinet.\n> go to countertop 1\n"
             "On the countertop 1, you see a mug 1.\n> take mug 1 from countertop 1\nYou pick up the mug 1."],
    "heat": ["You are in the kitchen.\nYour task is to: heat an egg.\n> go to fridge 1\nThe fridge 1 is closed.\n"
             "> open fridge 1\nYou open the fridge 1. In it, you see an egg 2.\n> take egg 2 from fridge 1\n"
             "You pick up the egg 2.\n> heat egg 2 with microwave 1\nYou heat the egg 2."],
}
TASKS = {
    "pick": ["You are in a room with a desk 1.\nYour task is to: put a pen on desk.",
             "You see a shelf 2 and a drawer 4.\nYour task is to: put a book in drawer.\n> go to shelf 2\n"
             "On the shelf 2, you see a book 3."],
    "heat": ["You are in the kitchen.\nYour task is to: heat a potato."],
}
CANDIDATES = ["go to desk 1", "take book 3 from shelf 2", "open drawer 4", "examine shelf 2"]


def prompt(task_type: str, task: str) -> str:
    return react_prompt(HEADER, DEMOS[task_type], task)


def assert_same_scores(got, ref):
    assert np.array_equal(got.n_tokens, ref.n_tokens)
    assert np.abs(got.log_q - ref.log_q).max() < 1e-4, (got.log_q, ref.log_q)
    rel = np.abs(got.hidden - ref.hidden).max() / np.abs(ref.hidden).max()
    assert rel < 1e-4, rel


def test_pinned_heads_give_uncached_numbers_and_encode_only_new_tokens(fresh_any):
    lm = fresh_any()
    uncached = fresh_any(reuse_cache=False)
    pinned = {t: lm.pin_prefix(react_head(HEADER, DEMOS[t])) for t in DEMOS}
    assert all(n > 50 for n in pinned.values()) and len(lm.cache.heads) == 2
    # episodes of alternating task types: each starts from its type's head, not from scratch
    for task_type, task in [("pick", TASKS["pick"][0]), ("heat", TASKS["heat"][0]), ("pick", TASKS["pick"][1])]:
        text = prompt(task_type, task)
        before = lm.cache.encoded_tokens
        got = lm.score(text, CANDIDATES, action_prefix("text"))
        encoded = lm.cache.encoded_tokens - before
        ids = lm.encode(text + action_prefix("text"))
        head_ids = lm.encode(react_head(HEADER, DEMOS[task_type]))
        reused = common_prefix_len(head_ids, ids)
        assert reused >= pinned[task_type] - 1
        assert encoded < len(ids) - reused + 2, (encoded, len(ids), reused)  # only the task's own tokens
        assert_same_scores(got, uncached.score(text, CANDIDATES, action_prefix("text")))


def test_generation_after_a_pinned_head_equals_the_uncached_reply(fresh_any):
    lm, uncached = fresh_any(), fresh_any(reuse_cache=False)
    lm.pin_prefix(react_head(HEADER, DEMOS["heat"]))
    lm.generate(prompt("pick", TASKS["pick"][0]), max_new_tokens=4)  # another type in between
    text = prompt("heat", TASKS["heat"][0])
    assert lm.generate(text, max_new_tokens=12) == uncached.generate(text, max_new_tokens=12)
    sampled = dict(max_new_tokens=8, temperature=0.7, n=3, seed=5)
    assert lm.generate(text, **sampled) == uncached.generate(text, **sampled)


def test_forks_share_heads_and_an_uncached_backend_pins_nothing(fresh_any):
    lm = fresh_any()
    scorer = lm.fork()
    scorer.pin_prefix(react_head(HEADER, DEMOS["pick"]))
    assert len(lm.cache.heads) == 1 and lm.cache.heads is scorer.cache.heads
    assert fresh_any(reuse_cache=False).pin_prefix(react_head(HEADER, DEMOS["pick"])) == 0


def test_head_store_drops_the_least_recently_used_head():
    store = HeadStore(max_heads=2)
    store.add((1, 2, 3), ["a"])
    store.add((4, 5), ["b"])
    assert store.best((1, 2, 9)) == (2, ["a"])  # (1, 2, 3) is now the most recently used
    store.add((6,), ["c"])
    assert (4, 5) not in store and (1, 2, 3) in store and len(store) == 2
    assert store.best((7,)) == (0, None)
    with pytest.raises(ValueError, match="max_heads=0"):
        HeadStore(0)


def test_reusable_prefix_is_what_the_next_call_does_not_encode(fresh_any):
    """The prefix the stream or a pinned head holds, as a benchmark's floor reads it before a call:
    the pinned head first, then the previous prompt; asking changes no cache."""
    lm = fresh_any()
    lm.pin_prefix(react_head(HEADER, DEMOS["pick"]))
    head_ids = lm.encode(react_head(HEADER, DEMOS["pick"]))
    stream = None
    for task in TASKS["pick"]:
        ids = lm.encode(prompt("pick", task))
        stored = lm.cache.ids
        n, _ = lm.cache.reusable_prefix(ids[:-1])
        assert lm.cache.ids == stored  # nothing changed by asking
        held = max(common_prefix_len(head_ids, ids[:-1]), common_prefix_len(stream or (), ids[:-1]))
        assert n == held > 0
        before = lm.cache.encoded_tokens
        lm.generate(prompt("pick", task), max_new_tokens=1)
        assert lm.cache.encoded_tokens - before == len(ids) - n
        stream = ids
    assert fresh_any(reuse_cache=False).cache.reusable_prefix(ids) == (0, None)


def test_the_prefix_cache_is_backend_neutral_and_both_backends_cache_ops_satisfy_its_protocol(fresh_any):
    """The bookkeeping module loads neither torch nor JAX; each backend's prefix cache runs on an
    operations object of the ``CacheOps`` protocol, with the protocol's methods and parameters."""
    import inspect
    import subprocess
    import sys

    from agent_shell.lm.kv_cache import CacheOps

    loaded = subprocess.run([sys.executable, "-c", "import sys, agent_shell.lm.kv_cache; "
                             "print(sorted({'torch', 'jax', 'transformers'} & set(sys.modules)))"],
                            capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout
    ops = fresh_any().cache.ops
    assert isinstance(ops, CacheOps)
    for name in ("new", "snapshot", "from_snapshot", "cut", "truncatable", "encode"):
        want = list(inspect.signature(getattr(CacheOps, name)).parameters)
        assert list(inspect.signature(getattr(type(ops), name)).parameters) == want, name
