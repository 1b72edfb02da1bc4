"""Packed scoring: every candidate's remaining tokens in ONE forward pass over a cached context.

All candidates share the tokens before the first action token; those ``s`` tokens are in the KV
cache (or the part of them a stream has not encoded yet leads the packed row, so that a step's
new context tokens and its candidates cost one pass). By default (``"packed"``) the candidates'
remaining tokens are packed into a single row, each segment attending to the context and
causally to itself only (a block-diagonal 4D mask with per-segment position ids), which costs
the same as one forward over context plus all candidate tokens and never copies the context's
KV M times. ``"batched"`` uses M right-padded rows
with a padding mask instead (for models that ignore custom 4D masks). The LM head runs only at the
positions that predict action tokens and at each final action token, whose head input is the
candidate's hidden state (seed App. B).

Must not import the agents or the environments.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from agent_shell.lm.kv_cache import Forward
from agent_shell.lm.tokenization import TokenizedContinuation

CANDIDATE_LAYOUTS = ("packed", "batched")


def head_pass(forward: Forward, head: torch.nn.Module, cache: Any, input_ids: torch.Tensor, keep: torch.Tensor,
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


def score_packed(forward: Forward, head: torch.nn.Module, cache: Any, s: int,
                 toks: Sequence[TokenizedContinuation], dtype: torch.dtype,
                 device: torch.device, start: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(log_q [M] float32, hidden [M, d] float32) with the candidates packed into one row after
    the ``s`` context tokens.

    ``cache`` holds the first ``start`` (default ``s``) tokens; the context's remaining tokens
    ``toks[0].ids[start:s]`` lead the same row (causal among themselves, seen by every
    candidate), so the context's new tokens and all candidates cost one forward pass. The cache
    then holds the context and the candidates: cut it back to ``s`` tokens to keep the context.
    """
    start = s if start is None else start
    head_ids = list(toks[0].ids[start:s])
    n_head = len(head_ids)
    segs = [t.ids[s:] for t in toks]
    lens = torch.tensor([len(g) for g in segs])
    total = int(lens.sum())
    input_ids = torch.tensor([head_ids + [i for g in segs for i in g]], device=device)
    seg_id = torch.repeat_interleave(torch.arange(len(segs)), lens)
    starts = torch.cumsum(lens, 0) - lens
    local = torch.arange(total) - starts[seg_id]
    allowed = torch.zeros(n_head + total, n_head + total, dtype=torch.bool)
    allowed[:n_head, :n_head] = torch.ones(n_head, n_head, dtype=torch.bool).tril()  # the context: causal
    allowed[n_head:, :n_head] = True  # every candidate sees the whole context
    allowed[n_head:, n_head:] = (seg_id[:, None] == seg_id[None, :]) & (local[None, :] <= local[:, None])
    mask = torch.zeros(1, 1, n_head + total, start + n_head + total, dtype=dtype)
    mask[0, 0, :, start:].masked_fill_(~allowed, torch.finfo(dtype).min)
    positions = torch.cat([torch.arange(start, s), s + local])
    # rows: the token before each action token (predicts it) ... the final action token
    keep, targets, owner, final_rows = [], [], [], []
    for m, t in enumerate(toks):
        lo = n_head + int(starts[m]) + (t.first - 1 - s)
        hi = n_head + int(starts[m]) + len(segs[m]) - 1  # final action token
        keep.extend(range(lo, hi + 1))
        targets.extend(t.ids[t.first:])
        owner.extend([m] * t.n_action)
        final_rows.append(len(keep) - 1)
    logits, head_in = head_pass(forward, head, cache, input_ids, torch.tensor(keep, device=device),
                                position_ids=positions.to(device)[None], attention_mask=mask.to(device))
    # logits row r predicts the next token; drop each candidate's final row
    pred_rows = [r for m in range(len(toks)) for r in range(final_rows[m] - toks[m].n_action, final_rows[m])]
    return gather(logits, head_in, pred_rows, targets, owner, final_rows, len(toks))


def score_batched(forward: Forward, head: torch.nn.Module, cache: Any, s: int,
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
    pred_rows, targets, owner, final_rows = [], [], [], []
    for m, t in enumerate(toks):
        j_final = len(segs[m]) - 1
        pred_rows.extend(m * width + j for j in range(j_final - t.n_action, j_final))
        targets.extend(t.ids[t.first:])
        owner.extend([m] * t.n_action)
        final_rows.append(m * width + j_final)
    return gather(logits, head_in, pred_rows, targets, owner, final_rows, m_count)


def gather(logits: torch.Tensor, head_in: torch.Tensor, pred_rows: list[int], targets: list[int],
           owner: list[int], final_rows: list[int], m_count: int) -> tuple[np.ndarray, np.ndarray]:
    """Sum each candidate's token log-probabilities (rows ``pred_rows`` predict ``targets``,
    candidate ``owner``) and take its hidden state at ``final_rows``."""
    dev = logits.device
    rows = torch.tensor(pred_rows, device=dev)
    target = torch.tensor(targets, device=dev)
    # log p(t) = logit_t - logsumexp(logits), in float64: a float32 log-softmax over a 49k
    # vocabulary is off by ~1e-5 per token, which adds up over an action's tokens
    token_lp = torch.empty(len(pred_rows), dtype=torch.float64, device=dev)
    for lo in range(0, len(pred_rows), 128):
        chunk = logits[rows[lo:lo + 128]].double()
        token_lp[lo:lo + 128] = chunk.gather(1, target[lo:lo + 128, None])[:, 0] - torch.logsumexp(chunk, -1)
    log_q = torch.zeros(m_count, dtype=torch.float64, device=dev)
    log_q.index_add_(0, torch.tensor(owner, device=dev), token_lp)
    hidden = head_in[torch.tensor(final_rows, device=dev)].float()
    return log_q.float().cpu().numpy(), hidden.cpu().numpy()


def action_positions(toks: Sequence[TokenizedContinuation], s: int, layout: str,
                     offset: int = 0) -> list[tuple[int, list[int]]]:
    """Per candidate, (batch row, positions of its action tokens) in the candidates' pass of
    :func:`score_packed` (``layout="packed"``: one row, segments side by side after ``offset``
    context tokens) or :func:`score_batched` (``"batched"``: row m, right-padded)."""
    out, start = [], offset
    for m, t in enumerate(toks):
        seg = len(t.ids) - s
        if layout == "packed":
            out.append((0, list(range(start + t.first - s, start + seg))))
            start += seg
        else:
            out.append((m, list(range(t.first - s, seg))))
    return out


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


__all__ = ["CANDIDATE_LAYOUTS", "action_positions", "captured_output", "gather", "head_pass", "pool_states",
           "score_batched", "score_packed"]
