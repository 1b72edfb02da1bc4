"""HuggingFace PyTorch backend of :class:`agent_shell.lm.protocol.LanguageModel` (transformers 5.x).

For a context x and candidate actions a_1..a_M it returns, per candidate (seed App. B):

* ``log_q[m]``: sum over the action's tokens t of log Q(t | x, prefix, earlier action tokens), in nats;
* ``n_tokens[m]``: L(a_m), the number of action tokens counted;
* ``hidden[m]``: the last-layer hidden state at the action's final token, i.e. exactly the vector
  the LM head reads there (for Llama-style models: after the final RMSNorm).

Token accounting. The string ``render(context, prefix) + action`` is tokenized as a whole (never
piece by piece, so no doubled BOS and no boundary artefacts); the action's tokens are the tokens
of that string whose character span reaches past the end of ``render(context, prefix)``. A token
that straddles the boundary (byte-level BPE glues the prefix's trailing space to the action's
first word: ``"\\n> " + "go"`` gives ``"\\n", ">", " go"``) is an action token, as in
lm-evaluation-harness, which moves trailing context whitespace into the continuation. Only action
tokens are counted and summed; every earlier token is conditioning.

Speed. All candidates share the tokens before the first action token. Those are encoded once
into a KV cache (and the cache is kept: the next call reuses the longest common token prefix, so
an episode whose context grows step by step only encodes the new tokens). Then every candidate's
remaining tokens are scored in ONE forward pass: by default they are packed into a single row,
each segment attending to the cached context and causally to itself only (a block-diagonal 4D
mask with per-segment position ids), which costs the same as one forward over context plus all
candidate tokens and never copies the context's KV M times. ``candidate_layout="batched"`` uses
M right-padded rows with a padding mask instead (for models that ignore custom 4D masks). The LM
head runs only at the positions that predict action tokens and at each final action token.

This module must not import the agents or the environments.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from agent_shell.lm.protocol import DEFAULT_ACTION_PREFIX, CandidateScores, Context

#: Accepted ``dtype`` spellings.
DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
}
#: ``"plain"``: ``context + action_prefix + action``; ``"chat"``: the context is one user message
#: rendered by the tokenizer's chat template with the assistant turn opened, then
#: ``action_prefix + action`` inside that turn.
FORMATTINGS = ("plain", "chat")
CANDIDATE_LAYOUTS = ("packed", "batched")
#: Longest stretch of new context tokens encoded in one forward pass (bounds attention memory).
PREFILL_CHUNK = 2048


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """Map ``"auto"``/``"bfloat16"``/``"float32"``/``"float16"`` (or a torch dtype) to a torch dtype.

    ``"auto"`` is bfloat16 where it is fast: on CUDA, and on CPUs for which oneDNN has bfloat16
    kernels (AVX-512 or AMX). On AVX2-only CPUs bfloat16 matmuls are emulated; measured on this
    project's AMD EPYC (AVX2) machines a SmolLM2 forward of 520 tokens took 7.5 s in bfloat16 and
    1.6 s in float32, so ``"auto"`` is float32 there.

    Raises:
        ValueError: an unknown name.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if str(dtype).lower() == "auto":
        if torch.device(device).type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if cpu_has_fast_bfloat16() else torch.float32
    try:
        return DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"dtype={dtype!r} is not 'auto' or one of {sorted(DTYPES)}") from None


def cpu_has_fast_bfloat16() -> bool:
    """Whether this CPU has native bfloat16 matmul kernels (oneDNN's check: AVX-512 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(frozen=True)
class TokenizedContinuation:
    """One candidate's tokenization.

    Attributes:
        ids: token ids of ``render(context, prefix) + action`` (special tokens included).
        first: index in ``ids`` of the first action token; ``ids[first:]`` are the action's tokens.
    """

    ids: tuple[int, ...]
    first: int

    @property
    def n_action(self) -> int:
        return len(self.ids) - self.first


def _common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class HFLanguageModel:
    """A frozen HuggingFace causal LM that scores candidate sets and generates text.

    Args:
        model: a loaded ``AutoModelForCausalLM`` (any decoder-only model with a KV cache).
        tokenizer: its tokenizer (a fast tokenizer gives exact character offsets; a slow one
            falls back to the common-token-prefix rule of lm-evaluation-harness).
        name: backbone identifier recorded in concept metadata.
        formatting: ``"plain"`` or ``"chat"`` (see :data:`FORMATTINGS`); recorded in concept
            metadata, and the same value must be used for fitting and acting.
        max_context_tokens: the window; default the config's ``max_position_embeddings``.
        candidate_layout: ``"packed"`` (default) or ``"batched"``; see the module docstring.
        reuse_cache: keep the last context's KV cache and reuse its common prefix next call.

    Raises:
        ValueError: unknown formatting or layout, or ``"chat"`` with a tokenizer that has no
            chat template.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str,
        formatting: str = "plain",
        max_context_tokens: int | None = None,
        candidate_layout: str = "packed",
        reuse_cache: bool = True,
    ) -> None:
        if formatting not in FORMATTINGS:
            raise ValueError(f"formatting={formatting!r} is not one of {FORMATTINGS}")
        if candidate_layout not in CANDIDATE_LAYOUTS:
            raise ValueError(f"candidate_layout={candidate_layout!r} is not one of {CANDIDATE_LAYOUTS}")
        if formatting == "chat" and not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"formatting='chat' but the tokenizer of {name!r} has no chat template")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.formatting = formatting
        self.candidate_layout = candidate_layout
        self.reuse_cache = reuse_cache
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.hidden_size: int = int(config.hidden_size)
        window = max_context_tokens or getattr(config, "max_position_embeddings", None)
        if not window:
            window = getattr(tokenizer, "model_max_length", None)
        if not window or window > 10**7:
            raise ValueError(f"cannot tell the context window of {name!r}; pass max_context_tokens")
        self.max_context_tokens: int = int(window)
        self.device: torch.device = next(model.parameters()).device
        self.dtype: torch.dtype = next(model.parameters()).dtype
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._head = model.get_output_embeddings()
        if self._head is None:
            raise ValueError(f"{name!r} has no output embeddings (LM head)")
        self._bos_id = tokenizer.bos_token_id
        self._special_ids = frozenset(getattr(tokenizer, "all_special_ids", ()))
        eos = set()
        for source in (getattr(model, "generation_config", None), tokenizer):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                eos.add(value)
            elif value is not None:
                eos.update(int(v) for v in value)
        self._eos_ids = frozenset(eos)
        # the stored prefix cache: token ids it covers and the transformers Cache (batch 1)
        self._cache_ids: tuple[int, ...] = ()
        self._cache: Any = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        name: str | None = None,
        dtype: str | torch.dtype = "auto",
        formatting: str = "plain",
        device: str | torch.device | None = None,
        **kwargs: Any,
    ) -> "HFLanguageModel":
        """Load a HuggingFace model folder (or hub name, if reachable) with its tokenizer.

        Args:
            path: folder with ``config.json``, weights and tokenizer files, or a hub name.
            name: identifier for concept metadata; default ``str(path)``.
            dtype: ``"auto"`` (bfloat16 on CUDA and on CPUs with native bfloat16, else float32;
                see :func:`resolve_dtype`), ``"bfloat16"``, ``"float32"`` or ``"float16"``.
            formatting, kwargs: see the class.
            device: torch device; default CUDA when available, else CPU.

        Raises:
            FileNotFoundError: the model cannot be loaded from ``path`` (message says why).
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dev = torch.device(device) if device is not None else default_device()
        torch_dtype = resolve_dtype(dtype, dev)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, attn_implementation="sdpa")
        except OSError as err:
            where = "folder" if Path(path).exists() else "name (no network at run time: pass a local folder)"
            raise FileNotFoundError(f"cannot load a causal LM from model {where} {str(path)!r}: {err}") from err
        model.to(dev)
        return cls(model, tokenizer, name=name or str(path), formatting=formatting, **kwargs)

    @property
    def metadata(self) -> dict[str, Any]:
        """What a fitted concept must record about the backbone (and check when acting)."""
        return {
            "name": self.name,
            "formatting": self.formatting,
            "hidden_size": self.hidden_size,
            "hidden": "last-layer state read by the LM head (after the final norm) at the final action token",
            "dtype": str(self.dtype).removeprefix("torch."),
        }

    # ------------------------------------------------------------------ formatting
    def render(self, context: Context, action_prefix: str = DEFAULT_ACTION_PREFIX) -> str:
        """The text every candidate is appended to: the conditioning of log Q(a | x).

        ``context`` is a text (joined per ``formatting``) or a list of chat messages
        (``{"role", "content"}``), which always go through the chat template with a generation
        prompt, so a candidate is the next assistant message's content.
        """
        if not isinstance(context, str):
            return self._template(context) + action_prefix
        if self.formatting == "plain":
            return context + action_prefix
        return self._chat(context) + action_prefix

    def render_prompt(self, prompt: Context) -> str:
        """The text :meth:`generate` continues (``"chat"``: a text prompt as one user message;
        a message list: through the chat template)."""
        if not isinstance(prompt, str):
            return self._template(prompt)
        return prompt if self.formatting == "plain" else self._chat(prompt)

    def _uses_template(self, context: Context) -> bool:
        return not isinstance(context, str) or self.formatting != "plain"

    def _chat(self, text: str) -> str:
        return self._template([{"role": "user", "content": text}])

    def _template(self, messages: Sequence[Mapping[str, str]]) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"model {self.name!r} has no chat template: use the text layout / plain formatting")
        messages = list(messages)
        if not messages:
            raise ValueError("empty message list: nothing to condition on")
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or m.get("role") not in ("system", "user", "assistant") \
                    or not isinstance(m.get("content"), str):
                raise ValueError(f"message {i} is {m!r}: need a dict with role system/user/assistant and str content")
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    # ------------------------------------------------------------------ tokenization
    def encode(self, text: str, templated: bool | None = None) -> list[int]:
        """Token ids of a rendered text: special tokens added once for plain text (a chat
        template writes its own; ``templated`` defaults to ``formatting == "chat"``), a doubled
        leading BOS collapsed."""
        templated = self.formatting != "plain" if templated is None else templated
        ids = self.tokenizer(text, add_special_tokens=not templated)["input_ids"]
        return self._dedupe_bos(list(ids))

    def _dedupe_bos(self, ids: list, offsets: list | None = None) -> list:
        if self._bos_id is not None and len(ids) >= 2 and ids[0] == ids[1] == self._bos_id:
            del ids[0]
            if offsets is not None:
                del offsets[0]
        return ids

    def tokenize_continuations(self, base: str, actions: Sequence[str],
                               templated: bool | None = None) -> list[TokenizedContinuation]:
        """Tokenize ``base + action`` for each action and locate its first action token.

        Raises:
            ValueError: an action that yields no token of its own.
        """
        fulls = [base + a for a in actions]
        templated = self.formatting != "plain" if templated is None else templated
        special = not templated
        out = []
        if getattr(self.tokenizer, "is_fast", False):
            enc = self.tokenizer(fulls, add_special_tokens=special, return_offsets_mapping=True)
            for action, ids, offsets in zip(actions, enc["input_ids"], enc["offset_mapping"]):
                ids, offsets = list(ids), list(offsets)
                self._dedupe_bos(ids, offsets)
                # an EOS-style token some tokenizers append is no part of the action
                while ids and ids[-1] in self._special_ids and tuple(offsets[-1]) == (0, 0):
                    ids.pop()
                    offsets.pop()
                first = next((k for k, (_, end) in enumerate(offsets) if end > len(base)), len(ids))
                out.append(TokenizedContinuation(tuple(ids), first))
        else:  # no offsets: the action's tokens are those after the common prefix with base's tokens
            base_ids = self.encode(base, templated)
            for full in fulls:
                ids = self.encode(full, templated)
                out.append(TokenizedContinuation(tuple(ids), _common_prefix_len(base_ids, ids)))
        for action, tok in zip(actions, out):
            if tok.n_action < 1:
                raise ValueError(f"candidate {action!r} yields no tokens of its own after the context")
        return out

    # ------------------------------------------------------------------ KV cache
    def _new_cache(self) -> Any:
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.model.config)
        except TypeError:  # older signature
            return DynamicCache()

    def _cache_reusable(self, cache: Any) -> bool:
        """Only plain full-attention layers can be truncated to a shorter prefix."""
        layers = getattr(cache, "layers", None)
        return bool(self.reuse_cache and layers) and all(type(l).__name__ == "DynamicLayer" for l in layers)

    @staticmethod
    def _snapshot(cache: Any) -> list[tuple[Any, Any]]:
        return [(layer.keys, layer.values) for layer in cache.layers]

    @staticmethod
    def _restore(cache: Any, snapshot: list[tuple[Any, Any]], length: int | None = None) -> None:
        for layer, (k, v) in zip(cache.layers, snapshot):
            if length is not None and k is not None:
                k, v = k[..., :length, :], v[..., :length, :]
            layer.keys, layer.values = k, v

    def _forward(self, input_ids: torch.Tensor, cache: Any, **kwargs: Any) -> Any:
        return self.model(input_ids=input_ids, use_cache=True, **{self._cache_kw: cache}, **kwargs)

    def _prefill(self, ids: Sequence[int]) -> Any:
        """A batch-1 cache holding exactly ``ids``, reusing the stored cache's common prefix.

        The stored cache is detached while it is being changed, so an exception never leaves a
        cache whose contents disagree with its recorded ids.
        """
        ids = tuple(ids)
        cache, start = None, 0
        if self._cache is not None and self.reuse_cache:
            lcp = _common_prefix_len(self._cache_ids, ids)
            if lcp > 0:
                cache, start = self._cache, lcp
                if lcp < len(self._cache_ids):
                    self._restore(cache, self._snapshot(cache), lcp)
        self._cache, self._cache_ids = None, ()
        if cache is None:
            cache = self._new_cache()
        for lo in range(start, len(ids), PREFILL_CHUNK):
            hi = min(lo + PREFILL_CHUNK, len(ids))
            chunk = torch.tensor([ids[lo:hi]], device=self.device)
            pos = torch.arange(lo, hi, device=self.device)[None]
            self._forward(chunk, cache, position_ids=pos, logits_to_keep=1)
        if len(ids) and self._cache_reusable(cache):
            self._cache, self._cache_ids = cache, ids
        return cache

    def reset_cache(self) -> None:
        """Forget the stored prefix cache (e.g. at the start of an unrelated episode)."""
        self._cache, self._cache_ids = None, ()

    # ------------------------------------------------------------------ scoring
    @torch.inference_mode()
    def score(
        self,
        context: Context,
        candidates: Sequence[str],
        action_prefix: str = DEFAULT_ACTION_PREFIX,
    ) -> CandidateScores:
        """Score each candidate as a continuation of ``render(context, action_prefix)``.

        Returns:
            CandidateScores with ``log_q`` [M] float32 (nats), ``n_tokens`` [M] int32 and
            ``hidden`` [M, hidden_size] float32 (LM-head input at the final action token).

        Raises:
            ValueError: empty candidate list, an empty (or non-string) candidate, a candidate with
                no tokens of its own, nothing to condition on, or context plus candidate longer
                than ``max_context_tokens``.
        """
        if isinstance(candidates, str):
            raise ValueError("candidates must be a sequence of strings, got one string")
        actions = list(candidates)
        if not actions:
            raise ValueError("empty candidate list: score() needs at least one candidate")
        for i, a in enumerate(actions):
            if not isinstance(a, str) or not a:
                raise ValueError(f"candidate {i} is {a!r}: every candidate must be a non-empty string")
        base = self.render(context, action_prefix)
        toks = self.tokenize_continuations(base, actions, self._uses_template(context))
        longest = max(toks, key=lambda t: len(t.ids))
        if len(longest.ids) > self.max_context_tokens:
            raise ValueError(
                f"context is too long: {longest.first} context tokens plus {longest.n_action} tokens of "
                f"candidate {actions[toks.index(longest)]!r} exceed the window of {self.max_context_tokens} "
                f"tokens of {self.name!r}"
            )
        shared = min(min(t.first for t in toks), min(_common_prefix_len(toks[0].ids, t.ids) for t in toks))
        if min(t.first for t in toks) < 1:
            raise ValueError(
                "nothing to condition on: the rendered context and prefix are empty and the tokenizer adds no BOS"
            )
        # cache all shared tokens but the last, so every candidate's segment starts with a token
        # whose output predicts its first (or only) action token
        s = shared - 1
        cache = self._prefill(toks[0].ids[:s])
        reusable = self._cache is cache
        snapshot = self._snapshot(cache) if reusable else None
        try:
            if self.candidate_layout == "packed":
                log_q, hidden = self._score_packed(cache, s, toks)
            else:
                log_q, hidden = self._score_batched(cache, s, toks)
        finally:
            if reusable:
                self._restore(cache, snapshot)
        n_tokens = np.array([t.n_action for t in toks], dtype=np.int32)
        return CandidateScores(log_q=log_q, n_tokens=n_tokens, hidden=hidden)

    def _head_pass(self, cache: Any, input_ids: torch.Tensor, keep: torch.Tensor, **kwargs: Any):
        """Forward with the LM head at ``keep`` only; returns (logits [K, V], head input [K, d])."""
        captured: list[torch.Tensor] = []
        handle = self._head.register_forward_hook(lambda mod, args, out: captured.append(args[0]))
        try:
            out = self._forward(input_ids, cache, logits_to_keep=keep, **kwargs)
        finally:
            handle.remove()
        d = captured[0].shape[-1]
        return out.logits.reshape(-1, out.logits.shape[-1]), captured[0].reshape(-1, d)

    def _score_packed(self, cache: Any, s: int, toks: list[TokenizedContinuation]):
        segs = [t.ids[s:] for t in toks]
        lens = torch.tensor([len(g) for g in segs])
        total = int(lens.sum())
        dev = self.device
        input_ids = torch.tensor([[i for g in segs for i in g]], device=dev)
        seg_id = torch.repeat_interleave(torch.arange(len(segs)), lens)
        starts = torch.cumsum(lens, 0) - lens
        local = torch.arange(total) - starts[seg_id]
        allowed = (seg_id[:, None] == seg_id[None, :]) & (local[None, :] <= local[:, None])
        mask = torch.zeros(1, 1, total, s + total, dtype=self.dtype)
        mask[0, 0, :, s:].masked_fill_(~allowed, torch.finfo(self.dtype).min)
        # rows: the token before each action token (predicts it) ... the final action token
        keep, targets, owner, final_rows = [], [], [], []
        for m, t in enumerate(toks):
            lo = int(starts[m]) + (t.first - 1 - s)
            hi = int(starts[m]) + len(segs[m]) - 1  # final action token
            keep.extend(range(lo, hi + 1))
            targets.extend(t.ids[t.first :])
            owner.extend([m] * t.n_action)
            final_rows.append(len(keep) - 1)
        keep_t = torch.tensor(keep, device=dev)
        logits, head_in = self._head_pass(
            cache, input_ids, keep_t, position_ids=(s + local).to(dev)[None], attention_mask=mask.to(dev)
        )
        # logits row r predicts the next token; drop each candidate's final row
        pred_rows = [r for m in range(len(toks)) for r in range(final_rows[m] - toks[m].n_action, final_rows[m])]
        return self._gather(logits, head_in, pred_rows, targets, owner, final_rows, len(toks))

    def _score_batched(self, cache: Any, s: int, toks: list[TokenizedContinuation]):
        segs = [t.ids[s:] for t in toks]
        width = max(len(g) for g in segs)
        m_count = len(segs)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        input_ids = torch.full((m_count, width), pad, dtype=torch.long)
        attn = torch.zeros(m_count, s + width, dtype=torch.long)
        attn[:, :s] = 1
        for m, g in enumerate(segs):
            input_ids[m, : len(g)] = torch.tensor(g)
            attn[m, s : s + len(g)] = 1
        if m_count > 1 and s > 0:
            cache.batch_repeat_interleave(m_count)
        keep = torch.arange(width, device=self.device)
        pos = (s + torch.arange(width, device=self.device))[None].expand(m_count, -1)
        logits, head_in = self._head_pass(
            cache, input_ids.to(self.device), keep, position_ids=pos, attention_mask=attn.to(self.device)
        )  # rows are m * width + j
        pred_rows, targets, owner, final_rows = [], [], [], []
        for m, t in enumerate(toks):
            j_final = len(segs[m]) - 1
            pred_rows.extend(m * width + j for j in range(j_final - t.n_action, j_final))
            targets.extend(t.ids[t.first :])
            owner.extend([m] * t.n_action)
            final_rows.append(m * width + j_final)
        return self._gather(logits, head_in, pred_rows, targets, owner, final_rows, m_count)

    def _gather(self, logits, head_in, pred_rows, targets, owner, final_rows, m_count):
        dev = logits.device
        rows = torch.tensor(pred_rows, device=dev)
        target = torch.tensor(targets, device=dev)
        # log p(t) = logit_t - logsumexp(logits), in float64: a float32 log-softmax over a 49k
        # vocabulary is off by ~1e-5 per token, which adds up over an action's tokens
        token_lp = torch.empty(len(pred_rows), dtype=torch.float64, device=dev)
        for lo in range(0, len(pred_rows), 128):
            chunk = logits[rows[lo : lo + 128]].double()
            token_lp[lo : lo + 128] = chunk.gather(1, target[lo : lo + 128, None])[:, 0] - torch.logsumexp(chunk, -1)
        log_q = torch.zeros(m_count, dtype=torch.float64, device=dev)
        log_q.index_add_(0, torch.tensor(owner, device=dev), token_lp)
        hidden = head_in[torch.tensor(final_rows, device=dev)].float()
        return log_q.float().cpu().numpy(), hidden.cpu().numpy()

    # ------------------------------------------------------------------ generation
    @torch.inference_mode()
    def generate(
        self,
        prompt: Context,
        max_new_tokens: int = 64,
        stop: Sequence[str] = (),
        temperature: float = 0.0,
        n: int = 1,
        seed: int | None = None,
    ) -> list[str]:
        """Return ``n`` continuations of ``render_prompt(prompt)``.

        Greedy when ``temperature == 0`` (then the ``n`` replies are identical); otherwise samples
        from softmax(logits / temperature) with a ``torch.Generator`` seeded by ``seed`` (same seed,
        same replies on the same machine and dtype). Each reply ends at an end-of-sequence token,
        after ``max_new_tokens`` tokens, or at the first occurrence of a stop string, which is cut
        off (the stop string itself excluded). The prompt's KV cache is kept, so a next prompt that
        extends it (a ReAct episode) only encodes its new tokens.

        Raises:
            ValueError: ``n < 1``, ``max_new_tokens < 0``, ``temperature < 0``, an empty stop
                string, an empty rendered prompt, or a prompt that fills the window.
        """
        if n < 1:
            raise ValueError(f"n={n}: need at least one reply")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={max_new_tokens} is negative")
        if temperature < 0:
            raise ValueError(f"temperature={temperature} is negative")
        if isinstance(stop, str):
            stop = (stop,)
        if any(not s for s in stop):
            raise ValueError(f"stop={stop!r} contains an empty string")
        ids = self.encode(self.render_prompt(prompt), self._uses_template(prompt))
        if not ids:
            raise ValueError("empty prompt: nothing to continue (the tokenizer adds no BOS)")
        room = self.max_context_tokens - len(ids)
        if room < 1 and max_new_tokens > 0:
            raise ValueError(
                f"prompt is too long: {len(ids)} tokens leave no room in the window of "
                f"{self.max_context_tokens} tokens of {self.name!r}"
            )
        budget = min(max_new_tokens, room)
        if budget == 0:
            return [""] * n
        rows = n if temperature > 0 else 1
        generator = None
        if temperature > 0:
            generator = torch.Generator(device=self.device)
            if seed is not None:
                generator.manual_seed(int(seed))
            else:
                generator.seed()
        cache = self._prefill(ids[:-1])
        reusable = self._cache is cache
        self._cache, self._cache_ids = None, ()  # detached until generation finishes cleanly
        out = self._forward(
            torch.tensor([ids[-1:]], device=self.device),
            cache,
            position_ids=torch.tensor([[len(ids) - 1]], device=self.device),
            logits_to_keep=1,
        )
        prompt_snapshot = self._snapshot(cache) if reusable else None
        texts = self._decode_loop(cache, out.logits[:, -1].float(), len(ids), rows, budget, stop, temperature, generator)
        if prompt_snapshot is not None:
            self._restore(cache, prompt_snapshot)
            self._cache, self._cache_ids = cache, tuple(ids)
        return texts if rows == n else texts * n

    def _decode_loop(self, cache, logits, length, rows, budget, stop, temperature, generator) -> list[str]:
        if rows > 1:
            cache.batch_repeat_interleave(rows)
            logits = logits.expand(rows, -1)
        new: list[list[int]] = [[] for _ in range(rows)]
        done = [False] * rows
        texts: list[str | None] = [None] * rows
        for step in range(budget):
            if temperature > 0:
                probs = torch.softmax(logits / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)[:, 0]
            else:
                nxt = logits.argmax(dim=-1)
            nxt_list = nxt.tolist()
            for r in range(rows):
                if done[r]:
                    continue
                if nxt_list[r] in self._eos_ids:
                    done[r] = True
                    continue
                new[r].append(nxt_list[r])
                if stop:
                    text = self.tokenizer.decode(new[r], skip_special_tokens=True)
                    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
                    if cut >= 0:
                        texts[r], done[r] = text[:cut], True
            if all(done) or step == budget - 1:
                break
            out = self._forward(
                nxt[:, None].to(self.device),
                cache,
                position_ids=torch.full((rows, 1), length + step, device=self.device),
                logits_to_keep=1,
            )
            logits = out.logits[:, -1].float()
        return [t if t is not None else self.tokenizer.decode(new[r], skip_special_tokens=True) for r, t in enumerate(texts)]
