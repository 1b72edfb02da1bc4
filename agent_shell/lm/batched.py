"""Several streams' calls in shared forward passes: candidate sets scored in ONE pass, replies
decoded together one token per pass, each over its own KV prefix.

Concurrent episodes ask the same backbone to score their candidate sets at about the same time.
:func:`score_many` takes such requests, brings each request's stream cache up to its context
(:class:`agent_shell.lm.kv_cache.PrefixCache`: only the step's new tokens are encoded), and
then scores all candidate sets in one batched pass: row b holds request b's candidates' prefix
tree as in :func:`agent_shell.lm.scoring.score_packed`, its keys and values are request b's prefix
(right-padded to the longest prefix, the padding masked out), and its position ids continue
its own prefix. The numbers are those of one :meth:`HFLanguageModel.score` call per request
(within float rounding; ``tests/lm/test_lm_batched.py``, 1e-4 nats).

:func:`generate_many` does the same for ``generate``: each request's prompt is brought up to
date on its own stream (only new tokens encoded), then all replies are decoded together: every
forward pass feeds one token per row, over keys and values that are each row's prompt
(right-padded to the longest, masked) followed by the tokens the rows generated so far. Each
row keeps its own budget, stop strings, temperature and seeded generator, so the replies are
those of one :meth:`HFLanguageModel.generate` call per request (greedy: the same text, up to
float rounding: a single call verifies prompt-lookup drafts several tokens a pass, these rows go
one token a pass, and in bfloat16 a near tie can go either way; sampled: the same draws of the
same seed, up to float rounding of the probabilities).

Must not import the agents or the environments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from agent_shell.lm.decoding import check_generation, extend_reply, sampler
from agent_shell.lm.kv_cache import PrefixCache
from agent_shell.lm.torch_kv import Snapshot, new_cache, snapshot
from agent_shell.lm.protocol import CandidateScores, Context, ContextWindowFull, check_candidates
from agent_shell.lm.scoring import cached_length, candidate_tree, gather, head_pass, head_rows
from agent_shell.lm.tokenization import TokenizedContinuation

if TYPE_CHECKING:
    from transformers.cache_utils import Cache

    from agent_shell.lm.hf import HFLanguageModel


@dataclass(frozen=True)
class ScoreRequest:
    """One ``score(context, candidates, action_prefix)`` call of one stream (an episode's view)."""

    stream: PrefixCache
    context: Context
    candidates: tuple[str, ...]
    action_prefix: str


def _tokenize(lm: HFLanguageModel, req: ScoreRequest) -> tuple[list[TokenizedContinuation], int]:
    """(tokenized candidates, cached length s) after the checks of :meth:`HFLanguageModel.score`."""
    actions = check_candidates(req.candidates)
    base, markers = lm.formatter.rendered(req.context, req.action_prefix)
    toks = lm.tokens.continuations(base, actions, markers)
    longest = max(len(t.ids) for t in toks)
    if longest > lm.max_context_tokens:
        raise ContextWindowFull(f"context is too long: {longest} tokens exceed the window of {lm.max_context_tokens} "
                         f"tokens of {lm.name!r}")
    if min(t.first for t in toks) < 1:
        raise ValueError("nothing to condition on: the rendered context and prefix are empty")
    return toks, cached_length(toks)


def _padded_cache(lm: HFLanguageModel, prefixes: list[Snapshot], depth: int) -> Cache:
    """A batch cache whose row b holds ``prefixes[b]`` (a :func:`snapshot`) right-padded with
    zeros to ``depth`` tokens; an empty prefix is all padding."""
    cache = new_cache(lm.model)
    for layer_index, layer in enumerate(cache.layers):
        ks, vs = [], []
        for saved in prefixes:
            k, v = saved[layer_index]
            if k is None or k.shape[-2] == 0:
                heads, dim = _kv_shape(prefixes, layer_index)
                k = v = torch.zeros(1, heads, 0, dim, dtype=lm.dtype, device=lm.device)
            ks.append(torch.nn.functional.pad(k, (0, 0, 0, depth - k.shape[-2])))
            vs.append(torch.nn.functional.pad(v, (0, 0, 0, depth - v.shape[-2])))
        keys, values = torch.cat(ks), torch.cat(vs)
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
    return cache


@torch.inference_mode()
def score_many(lm: HFLanguageModel, requests: Sequence[ScoreRequest]) -> list[CandidateScores]:
    """Score every request's candidate set; all candidate sets go through one forward pass.

    Args:
        lm: an :class:`agent_shell.lm.hf.HFLanguageModel` (its model, tokenizer and dtype).
        requests: the calls; each request's ``stream`` keeps that stream's context cache.

    Returns:
        One :class:`CandidateScores` per request, in order.

    Raises:
        ValueError: as :meth:`HFLanguageModel.score` for any request (no request is scored then).
    """
    prepared = [_tokenize(lm, r) for r in requests]
    prefixes = []
    for req, (toks, s) in zip(requests, prepared):
        cache = req.stream.prefill(toks[0].ids[:s], lm._forward)
        prefixes.append(snapshot(cache))  # tensors shared, nothing copied
    dev, dtype = lm.device, lm.dtype
    n_rows = len(requests)
    trees = [candidate_tree(toks, s, "tree") for toks, s in prepared]
    width = max(len(tree.tokens) for tree in trees)
    depth = max(s for _, s in prepared)
    # keys/values: each request's prefix, right-padded to `depth`
    cache = _padded_cache(lm, prefixes, depth)
    input_ids = torch.zeros(n_rows, width, dtype=torch.long)
    positions = torch.zeros(n_rows, width, dtype=torch.long)
    allowed = torch.zeros(n_rows, width, depth + width, dtype=torch.bool)
    allowed[:, torch.arange(width), depth + torch.arange(width)] = True  # padding rows see themselves
    heads = [head_rows(toks, tree, s) for (toks, s), tree in zip(prepared, trees)]  # per request
    for b, ((_, s), tree) in enumerate(zip(prepared, trees)):
        n = len(tree.tokens)
        input_ids[b, :n] = torch.tensor(tree.tokens)
        positions[b, :n] = s + torch.tensor(tree.depths, dtype=torch.long)
        allowed[b, :n, :s] = True
        allowed[b, :n, depth:depth + n] = torch.from_numpy(tree.ancestry())
    mask = torch.zeros(n_rows, 1, width, depth + width, dtype=dtype)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    keep_all = sorted({k for needed, _ in heads for k in needed})
    column = {k: i for i, k in enumerate(keep_all)}
    logits, head_in = head_pass(lm._forward, lm._head, cache, input_ids.to(dev), torch.tensor(keep_all, device=dev),
                                position_ids=positions.to(dev), attention_mask=mask.to(dev))
    logits = logits.reshape(n_rows, len(keep_all), -1)
    head_in = head_in.reshape(n_rows, len(keep_all), -1)
    out = []
    for b, ((toks, _), (needed, rows)) in enumerate(zip(prepared, heads)):
        cols = [column[k] for k in needed]
        log_q, hidden = gather(logits[b, cols], head_in[b, cols], *rows, len(toks))
        out.append(CandidateScores(log_q=log_q, n_tokens=np.array([t.n_action for t in toks], np.int32),
                                   hidden=hidden))
    return out


@dataclass(frozen=True)
class GenerateRequest:
    """One ``generate(prompt, max_new_tokens, stop, temperature, n=1, seed)`` call of one stream."""

    stream: PrefixCache
    prompt: Context
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    seed: int | None = None


@torch.inference_mode()
def generate_many(lm: HFLanguageModel, requests: Sequence[GenerateRequest]) -> list[str]:
    """One reply per request, all decoded together (one token per row per forward pass).

    Args:
        lm: an :class:`agent_shell.lm.hf.HFLanguageModel`.
        requests: the calls (one reply each); each request's ``stream`` keeps that stream's
            prompt cache afterwards, as :meth:`HFLanguageModel.generate` keeps its own.

    Returns:
        The replies, in order, each cut at its first stop string (excluded).

    Raises:
        ValueError: as :meth:`HFLanguageModel.generate` for any request (nothing is decoded then).
    """
    prepared = []
    for req in requests:
        stop = check_generation(req.max_new_tokens, req.stop, req.temperature, 1)
        ids, budget = lm.prompt_ids(req.prompt, req.max_new_tokens)
        prepared.append((ids, budget, stop))
    replies = [""] * len(requests)
    live = [b for b, (_, budget, _) in enumerate(prepared) if budget > 0]
    if not live:
        return replies
    dev = lm.device
    prefixes, logits, lengths = [], [], []
    for b in live:  # each prompt's new tokens on its own stream, as generate() encodes them
        ids = prepared[b][0]
        stream = requests[b].stream
        cache, start = stream.start(ids[:-1])
        out = stream.encode(cache, ids, start, lm._forward)
        prefixes.append(snapshot(cache))
        logits.append(out.logits[:, -1].float())
        lengths.append(len(ids))
        if stream.reusable(cache):  # the stream keeps its prompt; decoding runs on a copy
            stream.keep(cache, ids)
    rows, depth = len(live), max(lengths)
    cache = _padded_cache(lm, prefixes, depth)
    logits = torch.cat(logits)
    generators = [sampler(requests[b].temperature, requests[b].seed, dev) for b in live]
    budgets = [prepared[b][1] for b in live]
    new: list[list[int]] = [[] for _ in live]
    texts: list[str | None] = [None] * rows
    done = [False] * rows
    allowed = torch.zeros(rows, depth, dtype=torch.bool)
    for r, n in enumerate(lengths):
        allowed[r, :n] = True
    for step in range(max(budgets)):
        nxt = logits.argmax(dim=-1)
        for r, b in enumerate(live):
            if generators[r] is not None and not done[r]:
                probs = torch.softmax(logits[r:r + 1] / requests[b].temperature, dim=-1)
                nxt[r] = torch.multinomial(probs, 1, generator=generators[r])[0, 0]
        for r, b in enumerate(live):
            if not done[r]:
                done[r], texts[r] = extend_reply(new[r], int(nxt[r]), lm._eos_ids, prepared[b][2], lm.tokenizer)
                done[r] = done[r] or len(new[r]) >= budgets[r]
        if all(done):
            break
        allowed = torch.cat([allowed, torch.ones(rows, 1, dtype=torch.bool)], dim=1)
        mask = torch.zeros(rows, 1, 1, allowed.shape[1], dtype=lm.dtype)
        mask.masked_fill_(~allowed[:, None, None], torch.finfo(lm.dtype).min)
        positions = torch.tensor([[n + step] for n in lengths], device=dev)
        out = lm._forward(nxt[:, None].to(dev), cache, position_ids=positions, attention_mask=mask.to(dev),
                          logits_to_keep=1)
        logits = out.logits[:, -1].float()
    for r, b in enumerate(live):
        replies[b] = texts[r] if texts[r] is not None else lm.tokenizer.decode(new[r], skip_special_tokens=True)
    return replies


def _kv_shape(prefixes: list, layer_index: int) -> tuple[int, int]:
    """(heads, head dim) of a layer, from any request whose prefix is not empty."""
    for saved in prefixes:
        k = saved[layer_index][0]
        if k is not None and k.numel():
            return k.shape[1], k.shape[3]
    raise ValueError("no request has a cached prefix to take the key shape from")


__all__ = ["GenerateRequest", "ScoreRequest", "generate_many", "score_many"]
