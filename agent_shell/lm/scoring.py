"""Packed scoring: every candidate's remaining tokens in ONE forward pass over a cached context.

All candidates share the tokens before the first action token; those ``s`` tokens are in the KV
cache (or the part of them a stream has not encoded yet leads the packed row, so that a step's
new context tokens and its candidates cost one pass). By default (``"tree"``) the candidates'
remaining tokens are merged on their shared prefixes into a token prefix tree (``go to cabinet 1``
and ``go to cabinet 2`` share the nodes of ``go to cabinet``; duplicates share every node) and the
tree's nodes are packed into a single row: each node attends to the context and to itself and its
ancestors only, with the position id of its depth (a 4D mask). A causal LM's output at a token
depends only on the tokens before it, so every candidate gets exactly the log-probabilities and
hidden states of its own sequence (up to float rounding) from fewer tokens: on ALFWorld's
admissible commands the tree has 2.8x fewer nodes than the candidates have tokens.
``"packed"`` packs each candidate's whole segment instead (a block-diagonal mask, the tree
without sharing): the same numbers at the cost of one forward over context plus all candidate
tokens, never copying the context's KV M times. ``"batched"`` uses M right-padded rows with a
padding mask (for models that ignore custom 4D masks). The LM head runs only at the positions that
predict action tokens and at each final action token, whose head input is the candidate's hidden
state (seed App. B).

Must not import the agents or the environments.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import torch

from agent_shell.lm.kv_cache import Forward
from agent_shell.lm.layout import (CANDIDATE_LAYOUTS, PrefixTree, action_positions, batched_head_rows, cached_length,
                                    candidate_tree, head_rows)
from agent_shell.lm.tokenization import TokenizedContinuation

if TYPE_CHECKING:
    from transformers.cache_utils import Cache

def head_pass(forward: Forward, head: torch.nn.Module, cache: Cache, input_ids: torch.Tensor, keep: torch.Tensor,
              **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward with the LM head at ``keep`` only; returns (logits [K, V], head input [K, d])."""
    captured: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda mod, args, out: captured.append(args[0]))
    try:
        out = forward(input_ids, cache, logits_to_keep=keep, **kwargs)
    finally:
        handle.remove()
    d = captured[0].shape[-1]
    return out.logits.reshape(-1, out.logits.shape[-1]), captured[0].reshape(-1, d)


@dataclass(frozen=True)
class PackedPass:
    """The inputs of :func:`score_packed`'s one forward pass over a cache holding ``start`` tokens:
    ``input_ids`` [1, n] (the context's uncached tokens, then the tree's nodes), ``positions``
    [1, n], the additive 4D ``mask`` [1, 1, n, start + n], ``keep`` (the rows where the LM head
    runs) and :func:`gather`'s ``rows``."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    keep: torch.Tensor
    rows: tuple[list[int], list[int], list[int], list[int]]


def packed_pass(toks: Sequence[TokenizedContinuation], s: int, start: int, layout: str, dtype: torch.dtype,
                device: torch.device) -> PackedPass:
    """The single row of :func:`score_packed`: ``toks[0].ids[start:s]`` (causal among themselves)
    followed by the candidates' prefix tree after ``s`` (``layout="tree"``) or every candidate's
    whole segment (``"packed"``), each node seeing the context and its own ancestors."""
    head_ids = list(toks[0].ids[start:s])
    n_head = len(head_ids)
    tree = candidate_tree(toks, s, layout)
    n = n_head + len(tree.tokens)
    allowed = torch.zeros(n, n, dtype=torch.bool)
    allowed[:n_head, :n_head] = torch.ones(n_head, n_head, dtype=torch.bool).tril()  # the context: causal
    allowed[n_head:, :n_head] = True  # every candidate sees the whole context
    allowed[n_head:, n_head:] = torch.from_numpy(tree.ancestry())
    mask = torch.zeros(1, 1, n, start + n, dtype=dtype)
    mask[0, 0, :, start:].masked_fill_(~allowed, torch.finfo(dtype).min)
    positions = torch.cat([torch.arange(start, s), s + torch.tensor(tree.depths, dtype=torch.long)])
    needed, rows = head_rows(toks, tree, s)
    return PackedPass(input_ids=torch.tensor([head_ids + tree.tokens], device=device),
                      positions=positions.to(device)[None], mask=mask.to(device),
                      keep=torch.tensor([n_head + node for node in needed], device=device), rows=rows)


def score_packed(forward: Forward, head: torch.nn.Module, cache: Cache, s: int,
                 toks: Sequence[TokenizedContinuation], dtype: torch.dtype,
                 device: torch.device, start: int | None = None,
                 layout: str = "tree") -> tuple[np.ndarray, np.ndarray]:
    """(log_q [M] float32, hidden [M, d] float32) with the candidates' tokens after the ``s``
    context tokens in one row: their prefix tree's nodes (``layout="tree"``) or every candidate's
    whole segment (``"packed"``), laid out by :func:`packed_pass`.

    ``cache`` holds the first ``start`` (default ``s``) tokens; the context's remaining tokens
    ``toks[0].ids[start:s]`` lead the same row (causal among themselves, seen by every
    candidate), so the context's new tokens and all candidates cost one forward pass. The cache
    then holds the context and the candidates: cut it back to ``s`` tokens to keep the context.
    """
    p = packed_pass(toks, s, s if start is None else start, layout, dtype, device)
    logits, head_in = head_pass(forward, head, cache, p.input_ids, p.keep, position_ids=p.positions,
                                attention_mask=p.mask)
    return gather(logits, head_in, *p.rows, len(toks))


def score_batched(forward: Forward, head: torch.nn.Module, cache: Cache, s: int,
                  toks: Sequence[TokenizedContinuation], pad_id: int | None,
                  device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """As :func:`score_packed`, with one right-padded row per candidate (the cache is repeated)."""
    segs = [t.ids[s:] for t in toks]
    width = max(len(g) for g in segs)
    m_count = len(segs)
    input_ids = torch.full((m_count, width), pad_id if pad_id is not None else 0, dtype=torch.long)
    attn = torch.zeros(m_count, s + width, dtype=torch.long)
    attn[:, :s] = 1
    for m, g in enumerate(segs):
        input_ids[m, :len(g)] = torch.tensor(g)
        attn[m, s:s + len(g)] = 1
    if m_count > 1 and s > 0:
        cache.batch_repeat_interleave(m_count)
    keep = torch.arange(width, device=device)
    pos = (s + torch.arange(width, device=device))[None].expand(m_count, -1)
    logits, head_in = head_pass(forward, head, cache, input_ids.to(device), keep, position_ids=pos,
                                attention_mask=attn.to(device))  # rows are m * width + j
    positions, (pred_rows, targets, owner, final_rows) = batched_head_rows(toks, s, width)
    return gather(logits, head_in, [positions[i] for i in pred_rows], targets, owner,
                  [positions[i] for i in final_rows], m_count)


def gather(logits: torch.Tensor, head_in: torch.Tensor, pred_rows: list[int], targets: list[int],
           owner: list[int], final_rows: list[int], m_count: int) -> tuple[np.ndarray, np.ndarray]:
    """Sum each candidate's token log-probabilities (rows ``pred_rows`` predict ``targets``,
    candidate ``owner``) and take its hidden state at ``final_rows``."""
    dev = logits.device
    rows = torch.tensor(pred_rows, device=dev)
    # every distinct row's log-normaliser once (a prefix tree's shared nodes predict tokens of
    # several candidates), then log p(t) = logit_t - logsumexp(logits) in float64
    used, inverse = torch.unique(rows, return_inverse=True)
    log_norm = log_normalisers(logits[used])
    token_lp = logits[rows, torch.tensor(targets, device=dev)].double() - log_norm[inverse]
    log_q = torch.zeros(m_count, dtype=torch.float64, device=dev)
    log_q.index_add_(0, torch.tensor(owner, device=dev), token_lp)
    hidden = head_in[torch.tensor(final_rows, device=dev)].float()
    return log_q.float().cpu().numpy(), hidden.cpu().numpy()


def log_normalisers(logits: torch.Tensor) -> torch.Tensor:
    """float64 [K]: logsumexp of each row of ``logits`` [K, V] (any float dtype).

    The exponentials are taken in float32 after subtracting the row's maximum (relative error
    ~1e-7 each) and summed in float64, so the result is within ~1e-8 nats of a float64
    logsumexp at a fraction of its cost; a float32 sum over a 49k vocabulary drifts by ~1e-6 per
    token, which adds up over an action's tokens.
    """
    x = logits.float()  # ``logits`` itself when float32: never changed in place
    top = x.max(-1, keepdim=True).values
    # the exponentials overwrite the difference they are taken of: one [K, V] buffer, not two
    return top[:, 0].double() + torch.log((x - top).exp_().sum(-1, dtype=torch.float64))


@contextlib.contextmanager
def captured_output(module: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """Collect ``module``'s output tensor (the first element of a tuple output) at every call
    inside the block."""
    outputs: list[torch.Tensor] = []
    handle = module.register_forward_hook(lambda mod, args, out: outputs.append(out[0] if isinstance(out, tuple)
                                                                                else out))
    try:
        yield outputs
    finally:
        handle.remove()


def pool_states(states: torch.Tensor, positions: Sequence[tuple[int, list[int]]], pool: str) -> np.ndarray:
    """float32 [M, d]: ``states`` [B, T, d] at each candidate's last action position (``"last"``)
    or averaged over its action positions (``"mean"``)."""
    rows = [states[b, cols].float().mean(0) if pool == "mean" else states[b, cols[-1]].float()
            for b, cols in positions]
    return torch.stack(rows).cpu().numpy()


__all__ = ["CANDIDATE_LAYOUTS", "PackedPass", "PrefixTree", "action_positions", "cached_length", "candidate_tree",
           "captured_output", "gather", "head_pass", "head_rows", "log_normalisers", "packed_pass", "pool_states",
           "score_batched", "score_packed"]
