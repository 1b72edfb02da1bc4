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
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple, Sequence

import numpy as np
import torch

from agent_shell.lm.torch_kv import Forward
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


class HeadIndex(NamedTuple):
    """Where :func:`gather_on_device` reads a pass's LM-head outputs, as int64 device tensors:
    ``rows`` [P] the head rows predicting the action tokens ``targets`` [P] of candidates ``owner``
    [P]; ``used`` [U] those rows once each, ``inverse`` [P] each pair's place among them; ``final``
    [M] each candidate's final row."""

    rows: torch.Tensor
    targets: torch.Tensor
    owner: torch.Tensor
    used: torch.Tensor
    inverse: torch.Tensor
    final: torch.Tensor


def to_device(device: torch.device, *arrays: Sequence[int]) -> list[torch.Tensor]:
    """Integer arrays as int64 tensors on ``device`` in ONE host-to-device copy (views of it)."""
    sizes = [len(a) for a in arrays]
    flat = np.concatenate([np.asarray(a, np.int64).reshape(-1) for a in arrays]) if arrays else np.zeros(0, np.int64)
    on_device = torch.from_numpy(flat).to(device)
    return list(torch.split(on_device, sizes))


def head_index_arrays(pred_rows: Sequence[int], targets: Sequence[int], owner: Sequence[int],
                      final_rows: Sequence[int]) -> list[np.ndarray]:
    """:class:`HeadIndex`'s arrays on the host, in its order (each distinct row once: a prefix
    tree's shared nodes predict tokens of several candidates)."""
    used, inverse = np.unique(np.asarray(pred_rows, np.int64), return_inverse=True)
    return [np.asarray(pred_rows, np.int64), np.asarray(targets, np.int64), np.asarray(owner, np.int64), used,
            inverse.reshape(-1), np.asarray(final_rows, np.int64)]


@dataclass(frozen=True)
class PackedPass:
    """The inputs of :func:`score_packed`'s one forward pass over a cache holding ``start`` tokens:
    ``input_ids`` [1, n] (the context's uncached tokens, then the tree's nodes), ``positions``
    [1, n], the additive 4D ``mask`` [1, 1, n, start + n], ``keep`` (the rows where the LM head
    runs) and :func:`gather_on_device`'s ``index`` into them; two host-to-device copies in all (the
    integers, and the tree's boolean mask)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    keep: torch.Tensor
    index: HeadIndex


def packed_pass(toks: Sequence[TokenizedContinuation], s: int, start: int, layout: str, dtype: torch.dtype,
                device: torch.device) -> PackedPass:
    """The single row of :func:`score_packed`: ``toks[0].ids[start:s]`` (causal among themselves)
    followed by the candidates' prefix tree after ``s`` (``layout="tree"``) or every candidate's
    whole segment (``"packed"``), each node seeing the context and its own ancestors."""
    head_ids = list(toks[0].ids[start:s])
    n_head = len(head_ids)
    tree = candidate_tree(toks, s, layout)
    n = n_head + len(tree.tokens)
    allowed = np.zeros((n, n), bool)
    allowed[:n_head, :n_head] = np.tri(n_head, dtype=bool)  # the context: causal
    allowed[n_head:, :n_head] = True  # every candidate sees the whole context
    allowed[n_head:, n_head:] = tree.ancestry()
    needed, rows = head_rows(toks, tree, s)
    positions = np.concatenate([np.arange(start, s), s + np.asarray(tree.depths, np.int64)])
    ids, positions, keep, *index = to_device(device, head_ids + tree.tokens, positions,
                                             [n_head + node for node in needed], *head_index_arrays(*rows))
    mask = torch.zeros(1, 1, n, start + n, dtype=dtype, device=device)
    mask[0, 0, :, start:].masked_fill_(~torch.from_numpy(allowed).to(device), torch.finfo(dtype).min)
    return PackedPass(input_ids=ids[None], positions=positions[None], mask=mask, keep=keep, index=HeadIndex(*index))


def score_packed(forward: Forward, head: torch.nn.Module, cache: Cache, s: int,
                 toks: Sequence[TokenizedContinuation], dtype: torch.dtype,
                 device: torch.device, start: int | None = None,
                 layout: str = "tree") -> tuple[torch.Tensor, torch.Tensor]:
    """(log_q [M] float32, hidden [M, d] float32), tensors on ``device``, with the candidates' tokens
    after the ``s`` context tokens in one row: their prefix tree's nodes (``layout="tree"``) or
    every candidate's whole segment (``"packed"``), laid out by :func:`packed_pass`.

    ``cache`` holds the first ``start`` (default ``s``) tokens; the context's remaining tokens
    ``toks[0].ids[start:s]`` lead the same row (causal among themselves, seen by every
    candidate), so the context's new tokens and all candidates cost one forward pass. The cache
    then holds the context and the candidates: cut it back to ``s`` tokens to keep the context.
    Nothing is read back to the host.
    """
    p = packed_pass(toks, s, s if start is None else start, layout, dtype, device)
    logits, head_in = head_pass(forward, head, cache, p.input_ids, p.keep, position_ids=p.positions,
                                attention_mask=p.mask)
    return gather_on_device(logits, head_in, p.index, len(toks))


def score_batched(forward: Forward, head: torch.nn.Module, cache: Cache, s: int,
                  toks: Sequence[TokenizedContinuation], pad_id: int | None,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """As :func:`score_packed`, with one right-padded row per candidate (the cache is repeated)."""
    segs = [t.ids[s:] for t in toks]
    width = max(len(g) for g in segs)
    m_count = len(segs)
    input_ids = np.full((m_count, width), pad_id if pad_id is not None else 0, np.int64)
    attn = np.zeros((m_count, s + width), np.int64)
    attn[:, :s] = 1
    for m, g in enumerate(segs):
        input_ids[m, :len(g)] = g
        attn[m, s:s + len(g)] = 1
    if m_count > 1 and s > 0:
        cache.batch_repeat_interleave(m_count)
    positions, (pred_rows, targets, owner, final_rows) = batched_head_rows(toks, s, width)
    ids, attn_t, *index = to_device(device, input_ids.reshape(-1), attn.reshape(-1),
                                    *head_index_arrays([positions[i] for i in pred_rows], targets, owner,
                                                       [positions[i] for i in final_rows]))
    keep = torch.arange(width, device=device)
    pos = (s + torch.arange(width, device=device))[None].expand(m_count, -1)
    logits, head_in = head_pass(forward, head, cache, ids.view(m_count, width), keep, position_ids=pos,
                                attention_mask=attn_t.view(m_count, s + width))  # rows are m * width + j
    return gather_on_device(logits, head_in, HeadIndex(*index), m_count)


def gather_on_device(logits: torch.Tensor, head_in: torch.Tensor, index: HeadIndex,
                     m_count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(log_q [M] float32, hidden [M, d] float32) where ``logits`` [K, V] and ``head_in`` [K, d] lie:
    each candidate's token log-probabilities summed in float64 (log p(t) = logit_t - logsumexp of
    its row, every distinct row normalised once, :func:`log_normalisers`) and its LM-head input at
    its final row. No value is read back to the host."""
    log_norm = log_normalisers(logits[index.used])
    token_lp = logits[index.rows, index.targets].double() - log_norm[index.inverse]
    log_q = torch.zeros(m_count, dtype=torch.float64, device=logits.device).index_add_(0, index.owner, token_lp)
    return log_q.float(), head_in[index.final].float()


def gather(logits: torch.Tensor, head_in: torch.Tensor, pred_rows: list[int], targets: list[int],
           owner: list[int], final_rows: list[int], m_count: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`gather_on_device` of host index lists (rows ``pred_rows`` predict ``targets`` of
    candidate ``owner``; ``final_rows``), its results on the host as numpy float32."""
    index = HeadIndex(*to_device(logits.device, *head_index_arrays(pred_rows, targets, owner, final_rows)))
    log_q, hidden = gather_on_device(logits, head_in, index, m_count)
    return log_q.cpu().numpy(), hidden.cpu().numpy()


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


__all__ = ["CANDIDATE_LAYOUTS", "HeadIndex", "PackedPass", "PrefixTree", "action_positions", "cached_length",
           "candidate_tree", "captured_output", "gather", "gather_on_device", "head_index_arrays", "head_pass",
           "head_rows", "log_normalisers", "packed_pass", "pool_states", "score_batched", "score_packed", "to_device"]
