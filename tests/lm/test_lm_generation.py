"""Generation with both backends (PyTorch and JAX, ``backend``): greedy equals transformers' own
greedy search, seeded sampling is reproducible, stop strings cut, and the prompt's KV cache is
reused exactly; the PyTorch backend's shared-prefix sampling equals the copying path."""

from __future__ import annotations

import pytest
import torch

from conftest import passes

PROMPT = (
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 1 "
    "and a fridge 1.\nYour task is to: put a cool apple in countertop.\n> think: To solve the task,"
)


def hf_greedy(lm, prompt: str, max_new_tokens: int) -> str:
    ids = torch.tensor([lm.encode(prompt)])
    out = lm.model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=lm.tokenizer.eos_token_id)
    return lm.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def hf_greedy_ids(lm, prompt: str, max_new_tokens: int) -> list[int]:
    """transformers' greedy search's new token ids (its end-of-sequence token left out)."""
    ids = torch.tensor([lm.encode(prompt)])
    out = lm.model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=lm.tokenizer.eos_token_id)
    return [t for t in out[0, ids.shape[1]:].tolist() if t != lm.tokenizer.eos_token_id]


#: 20 prompts: game transcripts cut at different places, a routing line, an instruction
PROMPTS = [PROMPT[:k] for k in (60, 95, 130, 170, 200)] + [PROMPT] + [
    f"You are in the middle of a room. Looking quickly around you, you see a {a} 1, a {b} 2 and a sofa 1.\n"
    f"Your task is to: {task}.\n>" for a, b, task in (
        ("drawer", "shelf", "find two pillows and put them in sofa"), ("safe", "desk", "put a clean cloth in drawer"),
        ("bed", "garbagecan", "look at the bowl under the desklamp"), ("fridge", "sinkbasin", "cool a tomato"),
        ("microwave", "toaster", "heat some egg and put it in diningtable"),
        ("cabinet", "countertop", "put two spraybottle in toilet"))] + [
    "Q: What is 2 + 3?\nA:", "The capital of France is", "def add(a, b):\n    return", "Once upon a time, there",
    "Step 1: open the fridge.\nStep 2:", "1, 2, 3, 4, 5,", "Translate to French: good morning ->",
    "> think: First I need to find an apple."]


@pytest.mark.parametrize("k", [pytest.param(k, marks=[] if k in (0, 5, 9) else [pytest.mark.slow])
                               for k in range(len(PROMPTS))])
def test_greedy_gives_transformers_greedy_token_ids(fresh_any, lm32, monkeypatch, k):
    """Greedy replies (prompt-lookup drafts on) are transformers' greedy search token id for token
    id, in both backends (float32): every token the decoding loop takes is recorded."""
    from agent_shell.lm import decoding

    assert len(PROMPTS) == 20
    taken: list[int] = []
    real = decoding.extend_reply
    monkeypatch.setattr(decoding, "extend_reply", lambda tokens, token, *a: taken.append(token) or real(tokens, token, *a))
    want = hf_greedy_ids(lm32, PROMPTS[k], 16)
    (got,) = fresh_any().generate(PROMPTS[k], max_new_tokens=16)
    assert [t for t in taken if t != lm32.tokenizer.eos_token_id] == want
    assert got == lm32.tokenizer.decode(want, skip_special_tokens=True)


def test_greedy_matches_transformers_generate(fresh_any, lm32):
    lm = fresh_any()
    got = lm.generate(PROMPT, max_new_tokens=12)
    assert got == [hf_greedy(lm32, PROMPT, 12)]
    assert lm.generate(PROMPT, max_new_tokens=12, n=2) == got * 2  # greedy replies are identical


def test_seeded_sampling_is_reproducible(fresh_any):
    fresh = fresh_any
    lm = fresh()
    a = lm.generate(PROMPT, max_new_tokens=16, temperature=1.0, n=3, seed=7)
    b = fresh().generate(PROMPT, max_new_tokens=16, temperature=1.0, n=3, seed=7)
    c = lm.generate(PROMPT, max_new_tokens=16, temperature=1.0, n=3, seed=8)
    assert len(a) == 3 and a == b
    assert a != c  # 16 tokens at temperature 1 from a different seed
    assert len(set(a)) > 1  # the n replies are drawn independently


def test_sampled_rows_over_a_shared_prompt_equal_rows_over_copies_of_it(fresh, lm32):
    """Shared-prefix attention (the prompt's cache read once for all rows) gives the rows' logits
    of the copying path, replies and all, and leaves the prompt's cache as it was."""
    from agent_shell.lm.torch_kv import new_cache
    from agent_shell.lm.shared_prefix import PromptKV, SharedPrefix, attention, supports

    model = lm32.model
    assert supports(model)
    ids = torch.tensor([lm32.encode(PROMPT * 3)])
    rows, length = 5, ids.shape[1]
    steps = torch.randint(0, 2000, (rows, 6), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        prompt = new_cache(model)
        model(input_ids=ids, cache=prompt, use_cache=True)
        keys = [layer.keys for layer in prompt.layers]
        copies = new_cache(model)
        for layer, old in zip(copies.layers, prompt.layers):
            layer.lazy_initialization(old.keys, old.values)
            layer.keys, layer.values = old.keys.repeat(rows, 1, 1, 1), old.values.repeat(rows, 1, 1, 1)
        shared = SharedPrefix(model)
        suffix, prompt_kv = shared.new_cache(), PromptKV(prompt, length)
        for j in range(steps.shape[1]):
            at = {"position_ids": torch.full((rows, 1), length + j), "logits_to_keep": 1, "use_cache": True}
            ref = model(input_ids=steps[:, j : j + 1], cache=copies, **at).logits
            with shared.active():
                got = model(input_ids=steps[:, j : j + 1], cache=suffix, shared_prefix=prompt_kv, **at).logits
            assert torch.allclose(got, ref, atol=2e-4, rtol=0), (j, (got - ref).abs().max())
        assert model.config._attn_implementation == "sdpa"  # put back after each block
    assert all(layer.keys is k for layer, k in zip(prompt.layers, keys))  # the prompt's cache untouched
    assert suffix.layers[0].keys.shape == (rows, 3, steps.shape[1], 64)
    layer0, kv = model.model.layers[0].self_attn, torch.zeros(rows, 3, 2, 64)
    with pytest.raises(ValueError, match="one token per row"):
        attention(layer0, torch.zeros(rows, 9, 2, 64), kv, kv, None, 0.125, shared_prefix=prompt_kv)
    with pytest.raises(ValueError, match="no attention mask"):
        attention(layer0, torch.zeros(rows, 9, 1, 64), kv, kv, torch.ones(rows, 1, 1, 2), 0.125, shared_prefix=prompt_kv)
    with pytest.raises(ValueError, match="not \\[1, Hkv, 7, d\\]"):
        PromptKV(prompt, 7)
    with pytest.raises(RuntimeError, match="boom"), shared.active():  # put back on error too
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"


def test_generate_samples_rows_over_one_prompt_cache_with_the_copying_paths_replies(fresh, monkeypatch):
    """``generate(n > 1)`` goes through the shared prompt cache (copying it would fail here), gives
    the copying path's seeded replies, and a longer prompt afterwards reuses the cache exactly."""
    from transformers import DynamicCache

    sharing, copying = fresh(), fresh(shared_prefix=False)
    assert sharing._shared is not None and copying._shared is None
    off = copying.generate(PROMPT, max_new_tokens=16, temperature=0.7, n=6, seed=3)

    def no_copies(self, repeats):
        raise AssertionError("the prompt's cache was copied per row")

    with monkeypatch.context() as patch:
        patch.setattr(DynamicCache, "batch_repeat_interleave", no_copies)
        on = sharing.generate(PROMPT, max_new_tokens=16, temperature=0.7, n=6, seed=3)
    assert on == off and len(set(on)) > 1
    longer = PROMPT + on[0] + "\nOK.\n> go to fridge 1\nThe fridge 1 is closed.\n>"
    cands = ["open fridge 1", "go to countertop 1"]
    after = sharing.score(longer, cands, " ")
    ref = fresh(reuse_cache=False).score(longer, cands, " ")
    assert abs(after.log_q - ref.log_q).max() < 1e-4


def test_shared_prefix_attention_names_the_architectures_it_cannot_serve():
    from types import SimpleNamespace

    from agent_shell.lm.shared_prefix import SharedPrefix, supports

    gpt2 = SimpleNamespace(config=SimpleNamespace(model_type="gpt2"))
    windowed = SimpleNamespace(config=SimpleNamespace(model_type="qwen2", use_sliding_window=True))
    mixed = SimpleNamespace(config=SimpleNamespace(model_type="qwen3", layer_types=["full_attention", "sliding_attention"]))
    assert not any(supports(m) for m in (gpt2, windowed, mixed))
    assert supports(SimpleNamespace(config=SimpleNamespace(model_type="qwen2", use_sliding_window=False)))
    assert SharedPrefix.of(gpt2) is None
    with pytest.raises(ValueError, match="'gpt2'"):
        SharedPrefix(gpt2)


def test_stop_strings_cut_the_reply(fresh_any):
    lm = fresh_any()
    (full,) = lm.generate(PROMPT, max_new_tokens=24)
    words = full.split()
    assert len(words) >= 3, full
    stop = " " + words[2]
    (cut,) = lm.generate(PROMPT, max_new_tokens=24, stop=[stop, "never-appears"])
    assert cut == full[: full.index(stop)]
    with pytest.raises(ValueError, match="empty string"):
        lm.generate(PROMPT, stop=[""])
    assert lm.generate(PROMPT, max_new_tokens=0, n=2) == ["", ""]


def test_prompt_cache_reuse_is_exact(fresh_any, lm32):
    fresh = fresh_any
    lm = fresh(draft_tokens=0)  # one token per pass (drafts: the test below)
    (first,) = lm.generate(PROMPT, max_new_tokens=8)
    longer = PROMPT + first + "\nOK.\n> go to fridge 1\nThe fridge 1 is closed.\n> think: Now I"
    counted = passes(lm)
    (reused,) = lm.generate(longer, max_new_tokens=8)
    # the prompt's new tokens in one pass (it gives the first reply token), then one pass per token
    assert counted[0] < len(lm.encode(longer)) // 2 and counted[1:] == [1] * (len(counted) - 1) and len(counted) <= 8
    assert len(lm.cache.ids) == len(lm.encode(longer))
    assert reused == hf_greedy(lm32, longer, 8)
    # scoring after generation shares the same cache and stays exact
    after = lm.score(longer, ["open fridge 1", "go to countertop 1"], "\n> ")
    ref = fresh(reuse_cache=False).score(longer, ["open fridge 1", "go to countertop 1"], "\n> ")
    assert abs(after.log_q - ref.log_q).max() < 1e-4


def test_chat_generation_stops_at_end_of_turn(fresh_any):
    lm = fresh_any()
    (reply,) = lm.generate([{"role": "user", "content": "Say hello."}], max_new_tokens=40)
    assert "<|im_end|>" not in reply and "<|im_start|>" not in reply
    assert reply.strip()


def test_no_forward_records_an_autograd_graph(fresh):
    """With grad mode on (the caller's default), every forward of the backend runs in inference
    mode and nothing it keeps requires grad: a kept KV cache with a graph would hold every
    earlier step's activations alive (a ReAct run grew by ~150 MB a step)."""
    from agent_shell.lm.batched import GenerateRequest, generate_many

    assert torch.is_grad_enabled()
    lm = fresh()
    modes: list[bool] = []
    hook = lm.model.register_forward_pre_hook(lambda mod, args: modes.append(torch.is_inference_mode_enabled()))
    try:
        lm.pin_prefix(PROMPT[:80])
        lm.generate(PROMPT, max_new_tokens=4)
        lm.generate(PROMPT + " I", max_new_tokens=4, temperature=1.0, n=2, seed=0)
        lm.score(PROMPT, ["take apple 1", "look"], "\n> ")
        generate_many(lm, [GenerateRequest(lm.cache, PROMPT, 3, (), 0.0, None)])
    finally:
        hook.remove()
    assert len(modes) >= 5 and all(modes)
    kept = [t for layer in lm.cache.cache.layers for t in (layer.keys, layer.values)]
    assert kept and not any(t.requires_grad for t in kept)


TRANSCRIPT = (
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a cabinet 2, a "
    "countertop 1, a fridge 1 and a microwave 1.\nYour task is to: cool some apple and put it in countertop.\n"
    "> go to countertop 1\nOn the countertop 1, you see a apple 1 and a bread 1.\n> take apple 1 from countertop 1\n"
    "You pick up the apple 1 from the countertop 1.\n> go to fridge 1\nThe fridge 1 is closed.\n> open fridge 1\n"
    "You open the fridge 1. The fridge 1 is open. In it, you see nothing.\n> cool apple 1 with fridge 1\n"
    "You cool the apple 1 using the fridge 1.\n> go to countertop 1\nOn the countertop 1, you see a bread 1.\n>"
)


# the 30-token case (drafts accepted and compared with transformers' greedy reply) is slow: by parts
# the default suite has it (drafts accepted give the plain reply at 12 tokens, the plain reply is
# transformers' greedy one in test_greedy_matches_transformers_generate)
@pytest.mark.parametrize("prompt, budget, stop", [(TRANSCRIPT, 12, ("\n",)),
                                                  pytest.param(TRANSCRIPT, 30, (), marks=pytest.mark.slow),
                                                  (PROMPT, 16, ()), (TRANSCRIPT + " put", 1, ())])
def test_prompt_lookup_drafts_give_the_greedy_reply_in_fewer_passes(fresh_any, lm32, prompt, budget, stop):
    fresh = fresh_any
    drafted, plain = fresh(), fresh(draft_tokens=0)
    counted, plain_passes = passes(drafted), passes(plain)
    (got,) = drafted.generate(prompt, max_new_tokens=budget, stop=stop)
    (want,) = plain.generate(prompt, max_new_tokens=budget, stop=stop)
    assert got == want
    if not stop:
        assert got == hf_greedy(lm32, prompt, budget)
    assert len(counted) <= len(plain_passes)
    if prompt.startswith(TRANSCRIPT) and budget > 1:  # the transcript repeats itself: drafts are accepted
        assert len(counted) < len(plain_passes) and max(counted[1:]) > 1
    # the cache keeps the prompt (and scoring after it stays exact)
    assert len(drafted.cache.ids) == len(drafted.encode(prompt))
    after = drafted.score(prompt, ["open fridge 1", "put apple 1 in/on countertop 1"], " ")
    ref = fresh(reuse_cache=False).score(prompt, ["open fridge 1", "put apple 1 in/on countertop 1"], " ")
    assert abs(after.log_q - ref.log_q).max() < 1e-4


def test_lookup_draft_follows_the_latest_occurrence_of_the_longest_tail():
    from agent_shell.lm.decoding import lookup_draft

    assert lookup_draft([1, 2, 3, 9, 2, 3, 7, 5, 1, 2, 3]) == [9, 2, 3, 7, 5, 1, 2, 3][:8]  # 3-gram [1, 2, 3]
    assert lookup_draft([5, 2, 3, 8, 4, 2, 3, 6, 1, 2, 3], k=2) == [6, 1]  # latest [2, 3], 2 tokens
    assert lookup_draft([4, 3, 7, 7, 9, 3]) == [7, 7, 9, 3]  # only the 1-gram [3] occurs before
    assert lookup_draft([1, 2, 3]) == [] and lookup_draft([1]) == [] and lookup_draft([1, 1], k=0) == []
    assert lookup_draft([1, 1]) == [1]
    with pytest.raises(ValueError, match="draft_tokens=-1"):
        from agent_shell.lm.hf import HFLanguageModel
        HFLanguageModel(object(), None, name="x", draft_tokens=-1)
