"""Exactness of both backends' candidate scoring (PyTorch and JAX, ``backend``) against naive
re-encoding with the PyTorch model (fp32).

The reference here is written independently of the backends: it tokenizes ``context + prefix +
action`` as one string, finds the action's first token by decoding (the longest token prefix that
decodes to a prefix of ``context + prefix``), and runs one full forward pass per candidate of the
PyTorch model (transformers' own forward), on the real default backbone and on tiny random-weight
Llama and Qwen2 models.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agent_shell.context import action_prefix
from agent_shell.lm import LanguageModel
from agent_shell.lm.hf import HFLanguageModel
from agent_shell.lm.scoring import PrefixTree
from conftest import passes, view

PREFIX = action_prefix("text")  # the transcript's "\n> "

ALFWORLD_CANDIDATES = [
    "go to countertop 1",
    "take mug 2 from cabinet 3",
    "move apple 1 to fridge 1",
    "open microwave 1",
    "heat egg 1 with microwave 1",
    "examine desk 2",
]
BOUNDARY_CANDIDATES = [" leading space", "!bang.", "café ☕ 🍎", "look"]

OBSERVATION = (
    "You arrive at cabinet {i}. The cabinet {i} is open. In it, you see a mug {j}, a saltshaker {k}, "
    "and a dishsponge {i}.\n> go to countertop {j}\n"
)


def make_context(n_steps: int) -> str:
    header = (
        "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a "
        "countertop 1, a fridge 1 and a microwave 1.\nYour task is to: put a clean mug in coffeemachine.\n"
    )
    return header + "".join(OBSERVATION.format(i=i, j=i + 1, k=i + 2) for i in range(n_steps)) + "On it, you see"


_NAIVE: dict[tuple, tuple] = {}  # (model, context, action, prefix) -> naive_score, computed once


@torch.inference_mode()
def naive_score(lm: HFLanguageModel, context: str, action: str, prefix: str = PREFIX):
    """(log_q, n_tokens, hidden at final token) by one full forward over context+prefix+action."""
    key = (id(lm.model), context, action, prefix)
    if key not in _NAIVE:
        _NAIVE[key] = _naive_score(lm, context, action, prefix)
    return _NAIVE[key]


@torch.inference_mode()
def _naive_score(lm: HFLanguageModel, context: str, action: str, prefix: str):
    tok = lm.tokenizer
    base = context + prefix
    ids = tok(base + action)["input_ids"]
    first = max(k for k in range(len(ids) + 1) if base.startswith(tok.decode(ids[:k])))
    out = lm.model(torch.tensor([ids]), output_hidden_states=True)
    logp = torch.log_softmax(out.logits[0].double(), dim=-1)
    log_q = sum(logp[j - 1, ids[j]].item() for j in range(first, len(ids)))
    return log_q, len(ids) - first, out.hidden_states[-1][0, -1].double().numpy()


def backbone(model: str, backend: str, lm32, request) -> tuple[HFLanguageModel, LanguageModel]:
    """(the PyTorch reference, the backend under test) of the default backbone or a tiny model."""
    if model == "default":
        return lm32, (lm32 if backend == "torch" else request.getfixturevalue("jax32"))
    reference, jax_lm = request.getfixturevalue("tiny_backbones")[model]
    return reference, reference if backend == "torch" else jax_lm


@pytest.mark.parametrize("model", ["default", "llama", "qwen2"])
@pytest.mark.parametrize("n_steps", [0, 5, pytest.param(14, marks=pytest.mark.slow)])  # 14 steps: slow
def test_cached_scoring_equals_naive(lm32, backend, model, n_steps, request):
    reference, lm = backbone(model, backend, lm32, request)
    context = make_context(n_steps)
    # the boundary candidates on the short and medium contexts; the long one (one naive forward of
    # about 780 tokens per candidate) with three plain actions
    candidates = {0: ALFWORLD_CANDIDATES[:4] + BOUNDARY_CANDIDATES, 5: ALFWORLD_CANDIDATES[1:4] + BOUNDARY_CANDIDATES[1:3],
                  14: ALFWORLD_CANDIDATES[1:4]}[n_steps]
    layouts = ["tree", "packed", "batched"] if n_steps == 5 else ["tree", "packed"]
    refs = [naive_score(reference, context, a) for a in candidates]
    for layout in layouts:
        got = view(lm, candidate_layout=layout).score(context, candidates, PREFIX)
        assert got.log_q.shape == (len(candidates),) and got.log_q.dtype == np.float32
        assert got.hidden.shape == (len(candidates), reference.hidden_size) and got.hidden.dtype == np.float32
        assert got.n_tokens.dtype == np.int32
        for m, (log_q, n_tok, hidden) in enumerate(refs):
            assert got.n_tokens[m] == n_tok, (layout, candidates[m])
            assert abs(got.log_q[m] - log_q) < 1e-4, (layout, candidates[m], got.log_q[m], log_q)
            rel = np.abs(got.hidden[m] - hidden).max() / np.abs(hidden).max()
            assert rel < 1e-4, (layout, candidates[m], rel)


# shared token prefixes (go to cabinet N, go to countertop N), a duplicate, and candidates whose
# tokens are a prefix of another's ("go to cabinet 1" in "go to cabinet 1 now")
SHARING_CANDIDATES = ["go to cabinet 1", "go to cabinet 2", "go to cabinet 10", "go to countertop 1",
                      "go to cabinet 1 now", "go to cabinet 2", "open cabinet 1", "go", "look"]


def test_the_prefix_tree_layout_equals_naive_scoring_with_fewer_tokens(lm32, fresh_any):
    """Shared prefixes are encoded once, and each candidate still gets its own sequence's numbers."""
    context = make_context(3)
    refs = [naive_score(lm32, context, a) for a in SHARING_CANDIDATES]
    widths = {}
    for layout in ("tree", "packed"):
        lm = fresh_any(candidate_layout=layout)
        lm.cache.prefill(lm.encode(context + PREFIX)[:-1], lm._forward)  # the context cached: one pass left
        seen = passes(lm)
        got = lm.score(context, SHARING_CANDIDATES, PREFIX)
        widths[layout] = seen[-1]
        for m, (log_q, n_tok, hidden) in enumerate(refs):
            assert got.n_tokens[m] == n_tok, (layout, SHARING_CANDIDATES[m])
            assert abs(got.log_q[m] - log_q) < 1e-4, (layout, SHARING_CANDIDATES[m], got.log_q[m], log_q)
            rel = np.abs(got.hidden[m] - hidden).max() / np.abs(hidden).max()
            assert rel < 1e-4, (layout, SHARING_CANDIDATES[m], rel)
    tok = lm32.tokenizer
    segments = {tuple(tok(PREFIX + a, add_special_tokens=False)["input_ids"]) for a in SHARING_CANDIDATES}
    distinct_prefixes = {seg[:k] for seg in segments for k in range(1, len(seg) + 1)}
    assert widths["tree"] < widths["packed"] / 2, widths
    assert widths["tree"] <= len(distinct_prefixes), (widths, len(distinct_prefixes))


def test_prefix_tree_merges_shared_prefixes_and_masks_all_but_ancestors():
    tree = PrefixTree.of([[5, 6, 7], [5, 6, 8], [5, 6, 7], [9], [5, 6]])
    assert tree.tokens == [5, 6, 7, 8, 9]
    assert tree.parents == [-1, 0, 1, 1, -1] and tree.depths == [0, 1, 2, 2, 0]
    assert tree.paths == [[0, 1, 2], [0, 1, 3], [0, 1, 2], [4], [0, 1]]
    expected = torch.tensor([[1, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0],
                             [1, 1, 1, 0, 0],
                             [1, 1, 0, 1, 0],
                             [0, 0, 0, 0, 1]], dtype=torch.bool)
    assert np.array_equal(tree.ancestry(), expected.numpy())
    flat = PrefixTree.of([[5, 6, 7], [5, 6, 8]], share=False)  # the packed layout: one node per token
    assert flat.tokens == [5, 6, 7, 5, 6, 8] and flat.depths == [0, 1, 2, 0, 1, 2]
    assert flat.ancestry().sum() == 12  # two causal blocks of three


def test_context_lengths_span_the_claim(lm32):
    """The contexts above really are short, medium and long (about 60, 300 and 770 tokens)."""
    lengths = [len(lm32.encode(make_context(n))) for n in (0, 5, 14)]
    assert lengths[0] < 80 and 250 < lengths[1] < 400 and lengths[2] > 700, lengths


def test_hidden_is_the_lm_head_input_of_a_full_forward(lm32, fresh_any):
    context, action = make_context(2), "take mug 2 from cabinet 3"
    got = fresh_any().score(context, [action, "look"], PREFIX)
    ids = torch.tensor([lm32.encode(context + PREFIX + action)])
    with torch.inference_mode():  # the reference: a plain forward of the model
        out = lm32.model(ids, output_hidden_states=True)  # hidden_states[-1]: after the final norm
        # it is what the LM head reads: the head applied to it gives the full pass's logits there
        logits = lm32.model.lm_head(torch.from_numpy(got.hidden[0]))
    np.testing.assert_allclose(got.hidden[0], out.hidden_states[-1][0, -1].numpy(), rtol=0, atol=1e-4)
    np.testing.assert_allclose(logits.numpy(), out.logits[0, -1].numpy(), atol=2e-3)


# (context, prefix, action, decoded action tokens, token count) for SmolLM2's byte-level BPE
BOUNDARY_CASES = [
    ("You see a mug.", "\n> ", "go to countertop 1", " go to countertop 1", 6),
    ("You see a mug.", "\n> ", " leading", " leading", 1),  # the prefix's space stays separate
    ("You see a mug.", "\n> ", "!bang.", " !bang.", 4),
    ("You see a mug.", "\n> ", "café ☕ 🍎", " café ☕ 🍎", 7),
    ("ends in space ", "", "x", " x", 1),  # context's trailing space glues to the action
    ("ends in newline\n", "\n> ", "look", " look", 1),
    ("tab\t", "", "\tgo", "\tgo", 2),
    ("Nothing", "", ", then more", ", then more", 3),
]


@pytest.mark.parametrize("context,prefix,action,decoded,count", BOUNDARY_CASES)
def test_token_accounting_at_the_boundary(lm32, fresh_any, context, prefix, action, decoded, count):
    tok = lm32.tokenizer
    base = lm32.render(context, prefix)
    (t,) = lm32.tokenize_continuations(base, [action])
    assert list(t.ids) == tok(base + action)["input_ids"]  # one tokenization of the joined string
    action_text = tok.decode(list(t.ids[t.first :]))
    cond_text = tok.decode(list(t.ids[: t.first]))
    assert cond_text + action_text == base + action
    assert action_text.endswith(action) and base.endswith(action_text[: len(action_text) - len(action)])
    assert action_text == decoded and t.n_action == count
    got = fresh_any().score(context, [action], action_prefix=prefix)
    assert got.n_tokens[0] == count
    ref_log_q, ref_count, _ = naive_score(lm32, context, action, prefix)
    assert ref_count == count and abs(got.log_q[0] - ref_log_q) < 1e-4


def test_one_user_message_has_one_bos_and_counts_only_action_tokens(fresh_any, lm32):
    lm = fresh_any()
    message = [{"role": "user", "content": "You see a mug."}]
    base, markers = lm.formatter.rendered(message, "")
    assert base.startswith("<|im_start|>") and base.endswith("<|im_start|>assistant\n")
    (t,) = lm.tokenize_continuations(base, ["take mug 1"], markers)
    bos = lm32.tokenizer.bos_token_id
    assert t.ids[0] == bos and t.ids[1] != bos
    assert t.ids.count(bos) == base.count("<|im_start|>")
    assert lm32.tokenizer.decode(list(t.ids[t.first :])) == "take mug 1"
    got = lm.score(message, ["take mug 1", "look"], action_prefix="")
    ids = lm32.tokenizer(base + "take mug 1", add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        logp = torch.log_softmax(lm32.model(torch.tensor([ids])).logits[0].double(), -1)
    ref = sum(logp[j - 1, ids[j]].item() for j in range(t.first, len(ids)))
    assert got.n_tokens[0] == t.n_action and abs(got.log_q[0] - ref) < 1e-4


def test_cache_reuse_over_an_extended_context_equals_a_fresh_call(fresh_any):
    lm = fresh_any()
    counted = passes(lm)
    step1 = make_context(4)
    step2 = step1 + " a mug 3.\n> take mug 3 from countertop 2\nYou pick up the mug 3."
    lm.score(step1, ALFWORLD_CANDIDATES, PREFIX)
    counted.clear()
    reused = lm.score(step2, ALFWORLD_CANDIDATES, PREFIX)
    n_context = len(lm.encode(step2))
    assert sum(counted) < n_context // 2, (counted, n_context)  # the old prefix was not re-encoded
    assert len(counted) == 1  # the step's new context tokens and all candidates in one pass
    reference = fresh_any(reuse_cache=False).score(step2, ALFWORLD_CANDIDATES, PREFIX)
    np.testing.assert_allclose(reused.log_q, reference.log_q, atol=1e-4)
    np.testing.assert_allclose(reused.hidden, reference.hidden, atol=1e-4)
    # a context that is NOT an extension (earlier step, then an unrelated one) is still exact
    for ctx in (make_context(3), "A different game entirely.\n> look\nYou see nothing."):
        again = lm.score(ctx, ALFWORLD_CANDIDATES, PREFIX)
        ref = fresh_any(reuse_cache=False).score(ctx, ALFWORLD_CANDIDATES, PREFIX)
        np.testing.assert_allclose(again.log_q, ref.log_q, atol=1e-4)


def test_a_context_longer_than_a_prefill_chunk_scores_as_one_call(fresh_any, lm32, monkeypatch):
    """The new tokens beyond one chunk are encoded first, the last chunk rides with the candidates."""
    lm = fresh_any()
    monkeypatch.setattr(lm.cache.ops, "chunk", 16)
    counted = passes(lm)
    context, candidates = make_context(1), ALFWORLD_CANDIDATES[:3]
    got = lm.score(context, candidates, PREFIX)
    assert len(counted) >= 3 and counted[-2] <= 16  # chunks of the context, then the packed row
    for m, (log_q, n_tok, hidden) in enumerate(naive_score(lm32, context, a) for a in candidates):
        assert got.n_tokens[m] == n_tok and abs(got.log_q[m] - log_q) < 1e-4
        assert np.abs(got.hidden[m] - hidden).max() / np.abs(hidden).max() < 1e-4


def test_bad_inputs_raise_clear_errors(fresh_any):
    lm = fresh_any()
    with pytest.raises(ValueError, match="empty candidate list"):
        lm.score("ctx", [], PREFIX)
    with pytest.raises(ValueError, match="candidate 1 is ''"):
        lm.score("ctx", ["look", ""], PREFIX)
    with pytest.raises(ValueError, match="sequence of strings"):
        lm.score("ctx", "look", PREFIX)
    too_long = "take mug 1 from cabinet 2. " * 1400  # > 8,192 tokens
    assert len(lm.encode(too_long)) > lm.max_context_tokens
    with pytest.raises(ValueError, match="context is too long.*window of 8192"):
        lm.score(too_long, ["look"], PREFIX)
    with pytest.raises(ValueError, match="nothing to condition on"):
        lm.score("", ["look"], action_prefix="")
    with pytest.raises(ValueError, match="prompt is too long"):
        lm.generate(too_long)
    with pytest.raises(ValueError, match="candidate_layout='diagonal'"):
        view(lm, candidate_layout="diagonal")


def test_backend_satisfies_the_protocol(fresh_any):
    lm = fresh_any()
    assert isinstance(lm, LanguageModel)
    assert lm.hidden_size == 576 and lm.metadata["formatting"] == "plain"
    assert lm.metadata["name"] == lm.name and lm.metadata["dtype"] == "float32"


def test_fork_shares_the_weights_and_keeps_its_own_cache(fresh_any):
    lm = fresh_any()
    routing, scoring = make_context(3), "A different game entirely.\n> look\nYou see nothing."
    lm.score(routing, ALFWORLD_CANDIDATES, PREFIX)
    kept = lm.cache.ids
    twin = lm.fork()
    weights = (lambda v: v.model) if isinstance(lm, HFLanguageModel) else (lambda v: v.decoder)
    assert weights(twin) is weights(lm) and twin.tokenizer is lm.tokenizer and twin.cache is not lm.cache
    assert twin.cache.ids == () and len(kept) > 50
    got = twin.score(scoring, ALFWORLD_CANDIDATES, PREFIX)
    assert lm.cache.ids == kept and twin.cache.ids and twin.cache.ids != kept  # neither evicts the other
    ref = fresh_any(reuse_cache=False).score(scoring, ALFWORLD_CANDIDATES, PREFIX)
    np.testing.assert_allclose(got.log_q, ref.log_q, atol=1e-4)


@pytest.mark.parametrize("device, native, expected", [
    ("cpu", True, torch.bfloat16), ("cpu", False, torch.float32),
    ("cuda", True, torch.bfloat16), ("cuda", False, torch.float16),
])
def test_auto_dtype_takes_every_branch(monkeypatch, device, native, expected):
    """``auto`` follows the native-bfloat16 answer on every branch (not the answer of this machine)."""
    from agent_shell.lm import dtypes

    monkeypatch.setattr(dtypes, "native_bfloat16", lambda dev="cpu": native)
    assert dtypes.resolve_dtype("auto", device) == expected
    assert dtypes.dtype_name("auto", device) == str(expected).removeprefix("torch.")
    assert dtypes.resolve_dtype("bf16") == torch.bfloat16 and dtypes.resolve_dtype("float32") == torch.float32
    with pytest.raises(ValueError, match="dtype='int8'"):
        dtypes.resolve_dtype("int8")


def test_the_bfloat16_probe_agrees_with_the_cpu_flags():
    """Checked against the kernel's CPU flags, not against torch's probe: native bfloat16 on a CPU
    means AVX512-BF16 or AMX instructions."""
    from agent_shell.lm.dtypes import native_bfloat16

    flags = set(" ".join(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split())
    assert flags, "no CPU flags in /proc/cpuinfo"
    assert native_bfloat16("cpu") == bool(flags & {"avx512_bf16", "amx_tile"}), sorted(flags & {"avx512_bf16", "amx_tile"})


@pytest.fixture(scope="module")
def lm16():
    from agent_shell.lm import load_language_model

    return load_language_model(dtype="bfloat16", device="cpu")


@torch.inference_mode()
def naive_score_followed(lm: HFLanguageModel, context: str, action: str, extra: list[int], prefix: str = PREFIX):
    """:func:`naive_score` of ``action`` from a forward over its sequence followed by the tokens
    ``extra`` (causal attention: they cannot change it, but bfloat16 matmuls round differently for
    another sequence length, so the difference is bfloat16's own noise)."""
    tok = lm.tokenizer
    base = context + prefix
    ids = tok(base + action)["input_ids"]
    first = max(k for k in range(len(ids) + 1) if base.startswith(tok.decode(ids[:k])))
    out = lm.model(torch.tensor([ids + extra]), output_hidden_states=True)
    logp = torch.log_softmax(out.logits[0].double(), dim=-1)
    log_q = sum(logp[j - 1, ids[j]].item() for j in range(first, len(ids)))
    return log_q, len(ids) - first, out.hidden_states[-1][0, len(ids) - 1].double().numpy()


@pytest.mark.slow  # bfloat16 forwards are emulated (slow) on CPUs without native bf16
def test_bfloat16_backend_is_close_to_a_naive_bfloat16_forward(lm16):
    """End to end in bfloat16: the cached scoring in every layout against one naive bf16 forward per
    candidate, within three times bf16's own noise measured here (the same naive forward followed by 3
    or 7 more tokens), and ranking the candidates as the naive forward does. The log-softmax
    upcast is checked exactly by the next test."""
    assert lm16.dtype == torch.bfloat16 and lm16.metadata["dtype"] == "bfloat16"
    context, candidates = make_context(2), ALFWORLD_CANDIDATES[:3]
    refs = [naive_score(lm16, context, a) for a in candidates]
    noise_q = noise_h = 0.0
    for n in (3, 7):
        extra = lm16.tokenizer(" then", add_special_tokens=False)["input_ids"] * n
        for (log_q, n_tok, hidden), a in zip(refs, candidates):
            q, k, h = naive_score_followed(lm16, context, a, extra)
            assert k == n_tok
            noise_q = max(noise_q, abs(q - log_q))
            noise_h = max(noise_h, np.abs(h - hidden).max() / np.abs(hidden).max())
    assert 0 < noise_q < 0.5 and 0 < noise_h < 0.05  # bf16 rounding: present, and small
    naive_order = np.argsort([log_q for log_q, _, _ in refs])
    gaps = np.diff(np.sort([log_q for log_q, _, _ in refs]))
    assert gaps.min() > 6 * noise_q  # the ranking is decided above the tolerance on both sides
    for layout in ("tree", "packed", "batched"):
        got = HFLanguageModel(lm16.model, lm16.tokenizer, name=lm16.name, candidate_layout=layout).score(
            context, candidates, PREFIX)
        assert got.log_q.dtype == np.float32 and got.hidden.dtype == np.float32
        for m, (log_q, n_tok, hidden) in enumerate(refs):
            assert got.n_tokens[m] == n_tok
            assert abs(got.log_q[m] - log_q) <= 3 * noise_q, (layout, candidates[m], got.log_q[m], log_q, noise_q)
            rel = np.abs(got.hidden[m] - hidden).max() / np.abs(hidden).max()
            assert rel <= 3 * noise_h, (layout, candidates[m], rel, noise_h)
        assert list(np.argsort(got.log_q)) == list(naive_order), layout


def test_bfloat16_logits_are_turned_into_log_probs_in_float64(lm32, fresh):
    """The float32 backbone with its LM head's output rounded to bfloat16 (what a bf16 head
    returns): the float32 trunk leaves no shape noise, so the backend's log_q must match float64
    log-softmaxes of the naive forward's bf16 logits to 2e-3 nats. Taking the log-softmax in
    bfloat16 instead (no upcast) is off by up to 0.14 nats on these candidates."""
    handle = lm32.model.lm_head.register_forward_hook(lambda mod, args, out: out.to(torch.bfloat16))
    try:
        for n_steps in (3,):
            context = make_context(n_steps)
            refs = [_naive_score(lm32, context, a, PREFIX)[0]  # not memoised: the head is hooked
                    for a in ALFWORLD_CANDIDATES]
            for layout in ("tree", "packed", "batched"):
                got = fresh(candidate_layout=layout).score(context, ALFWORLD_CANDIDATES, PREFIX)
                np.testing.assert_allclose(got.log_q, refs, rtol=0, atol=2e-3, err_msg=layout)
    finally:
        handle.remove()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gather_normalises_each_distinct_row_once_to_float64_precision(dtype):
    """gather's log-probabilities equal float64 log-softmaxes of the (upcast) logits to 1e-7
    nats, with rows shared by several candidates (a prefix tree's shared nodes) normalised once:
    log_normalisers sees each distinct row once, and the sums per candidate are right."""
    from agent_shell.lm import scoring

    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(5, 49152, generator=gen) * 4).to(dtype)
    head_in = torch.randn(5, 8, generator=gen).to(dtype)
    pred_rows, targets, owner = [0, 1, 0, 2, 3, 0, 2], [7, 11, 7, 3, 40000, 9, 3], [0, 0, 1, 1, 1, 2, 2]
    seen: list[int] = []
    real = scoring.log_normalisers

    def counting(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape[0])
        return real(x)

    scoring.log_normalisers = counting
    try:
        log_q, hidden = scoring.gather(logits, head_in, pred_rows, targets, owner, [1, 3, 4], 3)
    finally:
        scoring.log_normalisers = real
    assert seen == [4]  # rows 0, 1, 2, 3: row 0 and row 2 are shared
    ref = torch.log_softmax(logits.double(), -1)
    want = np.zeros(3)
    for r, t, m in zip(pred_rows, targets, owner):
        want[m] += ref[r, t].item()
    np.testing.assert_allclose(log_q, want, rtol=0, atol=1e-5)  # float32 output of ~-40 nats
    lse = scoring.log_normalisers(logits)
    np.testing.assert_allclose(lse.numpy(), torch.logsumexp(logits.double(), -1).numpy(), rtol=0, atol=1e-7)
    np.testing.assert_array_equal(hidden, head_in[[1, 3, 4]].float().numpy())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_log_normalisers_keep_their_input_and_equal_the_two_buffer_formula(dtype):
    """The exponentials are taken in place of the difference, never of the logits (a float32
    input is its own upcast): the input is unchanged and the result equals, bit for bit, the
    formula that keeps the difference and its exponentials in two buffers."""
    from agent_shell.lm.scoring import log_normalisers

    logits = (torch.randn(6, 49152, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    before = logits.clone()
    got = log_normalisers(logits)
    assert torch.equal(logits, before)
    x = logits.float()
    top = x.max(-1, keepdim=True).values
    assert torch.equal(got, top[:, 0].double() + torch.log(torch.exp(x - top).sum(-1, dtype=torch.float64)))


CRAFTED_CONTEXTS = [
    "A note reads: \x00\x00 null bytes\x00 inside.\n> look\nNothing happens.",
    "Ｆｕｌｌｗｉｄｔｈ and combining e\u0301 marks; RTL \u05e9\u05dc\u05d5\u05dd and \u200bzero-width.",
    "Emoji 🍎🍏🍐 and a CJK fridge 冰箱 1, then a lone surrogate-free tail \U0001f9ea.",
]


@pytest.mark.parametrize("context", CRAFTED_CONTEXTS, ids=["nul", "marks", "emoji"])
def test_crafted_contexts_score_as_the_naive_forward(fresh_any, lm32, context):
    """NUL bytes, combining marks, right-to-left text, zero-width spaces and astral-plane characters
    in the context: each backend's scores equal one plain transformers forward per candidate."""
    candidates = ALFWORLD_CANDIDATES[:3] + BOUNDARY_CANDIDATES[2:3]
    got = fresh_any().score(context, candidates, PREFIX)
    for m, action in enumerate(candidates):
        log_q, n_tok, hidden = naive_score(lm32, context, action)
        assert got.n_tokens[m] == n_tok and abs(got.log_q[m] - log_q) < 1e-4, (context, action)
        assert np.abs(got.hidden[m] - hidden).max() / np.abs(hidden).max() < 1e-4, (context, action)
