"""The candidates' token layout of a scoring pass: which tokens a pass holds, where each one sits
and which rows the LM head reads (backend-neutral: no torch, no JAX).

A scoring call's candidates share the context's first ``s`` tokens (:func:`cached_length`); their
remaining tokens are merged on shared prefixes into a :class:`PrefixTree` (``layout="tree"``) or
laid out one node per token (``"packed"``), and :func:`head_rows` names the nodes whose outputs
predict action tokens. :mod:`agent_shell.lm.scoring` (PyTorch) and :mod:`agent_shell.lm.jax_backend`
(JAX) run the same layout through their own forward passes.

Must not import the agents or the environments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from agent_shell.lm.tokenization import TokenizedContinuation, common_prefix_len

#: The candidate layouts of a scoring pass (see :mod:`agent_shell.lm.scoring`).
CANDIDATE_LAYOUTS = ("tree", "packed", "batched")


@dataclass(frozen=True)
class PrefixTree:
    """Token segments merged on shared prefixes: one node per distinct (prefix, next token).

    Nodes are numbered in insertion order, so a parent precedes its children. ``paths[m]`` lists
    segment m's nodes in order (equal segments have equal paths when shared).
    """

    tokens: list[int]
    parents: list[int]  # -1 for a first token
    depths: list[int]  # 0 for a first token
    paths: list[list[int]]

    @classmethod
    def of(cls, segments: Sequence[Sequence[int]], share: bool = True) -> "PrefixTree":
        """The tree of ``segments`` (token ids); ``share=False``: one node per token (no merging)."""
        index: dict[tuple[int, int], int] = {}
        tokens: list[int] = []
        parents: list[int] = []
        depths: list[int] = []
        paths: list[list[int]] = []
        for seg in segments:
            parent, path = -1, []
            for tok in seg:
                node = index.get((parent, tok)) if share else None
                if node is None:
                    node = len(tokens)
                    index[(parent, tok)] = node
                    tokens.append(tok)
                    parents.append(parent)
                    depths.append(0 if parent < 0 else depths[parent] + 1)
                path.append(node)
                parent = node
            paths.append(path)
        return cls(tokens, parents, depths, paths)

    def ancestry(self) -> np.ndarray:
        """bool [n, n]: entry [i, j] is true when node j is node i or one of its ancestors."""
        n = len(self.tokens)
        allowed = np.eye(n, dtype=bool)
        depths = np.asarray(self.depths, dtype=np.int64)
        parents = np.asarray(self.parents, dtype=np.int64)
        for depth in range(1, int(depths.max()) + 1 if n else 0):  # parents' rows are complete first
            level = np.nonzero(depths == depth)[0]
            allowed[level] |= allowed[parents[level]]
        return allowed


def cached_length(toks: Sequence[TokenizedContinuation]) -> int:
    """``s``: the tokens every candidate's sequence shares before its first action token, but the
    last, so every candidate's segment starts with a token whose output predicts its first (or
    only) action token. The first ``s`` tokens are the context a pass can take from the cache.
    The ids are compared after the prefix the candidates are known to share (``shared``)."""
    known = min(t.shared for t in toks)
    first = toks[0].ids[known:]
    return min(min(t.first for t in toks), known + min(common_prefix_len(first, t.ids[known:]) for t in toks)) - 1


def candidate_tree(toks: Sequence[TokenizedContinuation], s: int, layout: str) -> PrefixTree:
    """The prefix tree of the candidates' tokens after the ``s`` shared ones (merged for
    ``layout="tree"``, one node per token for ``"packed"``)."""
    return PrefixTree.of([t.ids[s:] for t in toks], share=layout == "tree")


def head_rows(toks: Sequence[TokenizedContinuation], tree: PrefixTree,
              s: int) -> tuple[list[int], tuple[list[int], list[int], list[int], list[int]]]:
    """Where the LM head must run in a pass over ``tree``'s nodes: the sorted nodes before each
    action token (they predict it) through each final action token, and :func:`gather`'s
    ``(pred_rows, targets, owner, final_rows)`` with rows indexing those nodes."""
    needed = sorted({node for t, path in zip(toks, tree.paths) for node in path[t.first - 1 - s:]})
    column = {node: i for i, node in enumerate(needed)}
    pred_rows, targets, owner, final_rows = [], [], [], []
    for m, (t, path) in enumerate(zip(toks, tree.paths)):
        pred_rows.extend(column[node] for node in path[t.first - 1 - s:-1])
        targets.extend(t.ids[t.first:])
        owner.extend([m] * t.n_action)
        final_rows.append(column[path[-1]])
    return needed, (pred_rows, targets, owner, final_rows)


def batched_head_rows(toks: Sequence[TokenizedContinuation], s: int,
                      width: int) -> tuple[list[int], tuple[list[int], list[int], list[int], list[int]]]:
    """:func:`head_rows` of the batched layout: one row of ``width`` tokens per candidate (its
    tokens after the ``s`` shared ones, right-padded), its positions numbered ``m * width + j``.
    Returns the sorted positions before each action token through each final action token, and
    ``(pred_rows, targets, owner, final_rows)`` with rows indexing those positions."""
    needed, pred_rows, targets, owner, final_rows = [], [], [], [], []
    for m, t in enumerate(toks):
        j_final = len(t.ids) - s - 1
        first = len(needed)
        needed.extend(m * width + j for j in range(j_final - t.n_action, j_final + 1))
        pred_rows.extend(range(first, first + t.n_action))
        targets.extend(t.ids[t.first:])
        owner.extend([m] * t.n_action)
        final_rows.append(first + t.n_action)
    return needed, (pred_rows, targets, owner, final_rows)


def action_positions(toks: Sequence[TokenizedContinuation], s: int, layout: str,
                     offset: int = 0) -> list[tuple[int, list[int]]]:
    """Per candidate, (batch row, positions of its action tokens) in the candidates' pass of
    :func:`score_packed` (``layout="tree"`` or ``"packed"``: one row, the tree's nodes after
    ``offset`` context tokens) or :func:`score_batched` (``"batched"``: row m, right-padded)."""
    if layout == "batched":
        return [(m, list(range(t.first - s, len(t.ids) - s))) for m, t in enumerate(toks)]
    tree = candidate_tree(toks, s, layout)
    return [(0, [offset + node for node in path[t.first - s:]]) for t, path in zip(toks, tree.paths)]


__all__ = ["CANDIDATE_LAYOUTS", "PrefixTree", "action_positions", "batched_head_rows", "cached_length",
           "candidate_tree", "head_rows"]
