"""HuggingFace PyTorch backend of :class:`agent_shell.lm.protocol.LanguageModel` (transformers 5.x).

For a context x and candidate actions a_1..a_M it returns, per candidate (seed App. B):

* ``log_q[m]``: sum over the action's tokens t of log Q(t | x, prefix, earlier action tokens), in nats;
* ``n_tokens[m]``: L(a_m), the number of action tokens counted;
* ``hidden[m]``: the last-layer hidden state at the action's final token, i.e. exactly the vector
  the LM head reads there (for Llama-style models: after the final RMSNorm).

The parts live in one module each: :mod:`~agent_shell.lm.formatting` (the conditioning text),
:mod:`~agent_shell.lm.tokenization` (token accounting at the context/action boundary),
:mod:`~agent_shell.lm.kv_cache` (the prefix cache reused across calls, over transformers' caches:
:mod:`~agent_shell.lm.torch_kv`),
:mod:`~agent_shell.lm.scoring` (all candidates in one pass, shared prefixes once) and
:mod:`~agent_shell.lm.decoding` (generation); :mod:`~agent_shell.lm.dtypes` holds the dtype rule.
This class wires them to one model and tokenizer.

This module must not import the agents or the environments.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from agent_shell.lm.decoding import DRAFT_TOKENS, check_generation, decode, eos_ids, sampler
from agent_shell.lm.dtypes import resolve_device, resolve_dtype
from agent_shell.lm.faults import pass_fault
from agent_shell.lm.protocol import CandidateScores, Context, DeviceScores
from agent_shell.lm.torch_kv import TransformersKV, restore, snapshot
from agent_shell.lm.scoring import (action_positions, captured_output, pool_states, score_batched,
                                    score_packed)
from agent_shell.lm.shared_prefix import SharedPrefix
from agent_shell.lm.tokenization import TokenizedContinuation
from agent_shell.lm.tokenized import TokenizedBackend

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from transformers.cache_utils import Cache
    from transformers.modeling_outputs import CausalLMOutputWithPast


def choose_attention(device: torch.device) -> None:
    """The attention kernels the backend's passes may use on ``device``: on a CUDA device cuDNN's
    scaled-dot-product attention is switched off (process-wide; flash, memory-efficient and math
    stay on). On an H200 (a 1.59B random Llama, bfloat16, 1,000-token context, 30 candidates) its
    host time led a warm step's, planning anew for every new shape: 12 warm steps took a median of
    123 ms with it and 54 ms without, and its spikes at new shapes (three of twelve steps at 1.15
    to 1.19 s) vanished. On a CPU nothing changes."""
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


class HFLanguageModel(TokenizedBackend):
    """A frozen HuggingFace causal LM that scores candidate sets and generates text (rendering,
    tokenization and the checks before a pass: :class:`agent_shell.lm.tokenized.TokenizedBackend`).

    Args:
        model: a loaded ``AutoModelForCausalLM`` (any decoder-only model with a KV cache).
        tokenizer: its tokenizer (a fast tokenizer gives exact character offsets; a slow one
            falls back to the common-token-prefix rule of lm-evaluation-harness).
        name: backbone identifier recorded in concept metadata.
        max_context_tokens: the window; default the config's ``max_position_embeddings``.
        candidate_layout: ``"tree"`` (default: the candidates' shared token prefixes encoded once),
            ``"packed"`` (every candidate's tokens) or ``"batched"``; see :mod:`agent_shell.lm.scoring`.
        reuse_cache: keep the last context's KV cache and reuse its common prefix next call, and
            keep pinned prompt heads (:meth:`pin_prefix`).
        max_heads: how many pinned heads are kept (least recently used dropped first).
        draft_tokens: greedy single replies are verified in drafts of at most this many tokens
            looked up in the prompt (:mod:`agent_shell.lm.decoding`); 0 decodes one token per pass,
            as do models whose cache cannot be cut back (sliding-window or linear-attention layers).
        shared_prefix: sampled replies (``n > 1``) read the prompt's cache once, all rows together
            (:mod:`agent_shell.lm.shared_prefix`), where the architecture allows; False (or an
            unsupported model) copies the cache once per row.

    Raises:
        ValueError: unknown candidate layout, no LM head, an unknown context window, or negative
            ``draft_tokens``.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, name: str,
                 max_context_tokens: int | None = None, candidate_layout: str = "tree", reuse_cache: bool = True,
                 max_heads: int = 16, draft_tokens: int = DRAFT_TOKENS, shared_prefix: bool = True) -> None:
        self.check_options(candidate_layout, draft_tokens)
        self.model = model.eval()
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.hidden_size: int = int(config.hidden_size)
        self._set_text(tokenizer, name, max_context_tokens or getattr(config, "max_position_embeddings", None))
        self.device: torch.device = next(model.parameters()).device
        choose_attention(self.device)
        self.dtype: torch.dtype = next(model.parameters()).dtype
        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self._head = model.get_output_embeddings()
        if self._head is None:
            raise ValueError(f"{name!r} has no output embeddings (LM head)")
        self._eos_ids = eos_ids(model, tokenizer)
        self._set_options(candidate_layout, reuse_cache, max_heads, draft_tokens)
        self._shared = SharedPrefix.of(model) if shared_prefix else None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, name: str | None = None, dtype: str | torch.dtype = "auto",
                        device: str | torch.device | None = None, **kwargs: Any) -> "HFLanguageModel":
        """Load a HuggingFace model folder (or hub name, if reachable) with its tokenizer.

        The weights load straight onto ``device`` (``device_map``: no staging copy in host memory)
        in the dtype resolved for that device.

        Args:
            path: folder with ``config.json``, weights and tokenizer files, or a hub name.
            name: identifier for concept metadata; default ``str(path)``.
            dtype: ``"auto"`` (:func:`agent_shell.lm.dtypes.resolve_dtype` on ``device``),
                ``"bfloat16"``, ``"float32"`` or ``"float16"``.
            device: ``"auto"``/None (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``,
                ``"cuda:N"`` (:func:`agent_shell.lm.dtypes.resolve_device`).
            kwargs: see the class.

        Raises:
            FileNotFoundError: the model cannot be loaded from ``path`` (one line saying why).
            agent_shell.lm.model_config.BadModelFolder: the folder disagrees with its weights, holds
                a broken file (:func:`agent_shell.lm.model_folder.check_model_folder`) or weights
                that are not finite.
            ValueError: an unknown dtype or device, or a CUDA device this machine lacks.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from agent_shell.lm.model_folder import check_model_folder, refuse_nonfinite

        dev = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, dev)
        if os.path.isdir(path):
            check_model_folder(path, "hf")  # the folder against its weights, before anything loads
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, attn_implementation="sdpa",
                                                         device_map=dev)
        except OSError as err:
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise FileNotFoundError(f"cannot load a causal LM from {str(path)!r}: {reason}") from err
        refuse_nonfinite(path, ((n, int((~torch.isfinite(t)).sum())) for n, t in model.state_dict().items()
                                if t.is_floating_point()))
        return cls(model, tokenizer, name=name or str(path), **kwargs)

    def cache_ops(self) -> TransformersKV:
        """transformers' caches of this model, on its device."""
        return TransformersKV(self.model, self.device)

    @torch.inference_mode()
    def _forward(self, input_ids: torch.Tensor, cache: Cache, **kwargs: Any) -> CausalLMOutputWithPast:
        # every forward of the backend goes through here: never record an autograd graph (a
        # kept KV cache would otherwise hold every earlier step's activations alive)
        try:
            return self.model(input_ids=input_ids, use_cache=True, **{self._cache_kw: cache}, **kwargs)
        except (IndexError, RuntimeError) as err:  # out of memory (the episode's), or shapes that do not fit
            held = cache.get_seq_length() if hasattr(cache, "get_seq_length") else 0
            raise pass_fault(err, "the PyTorch forward pass", int(held) + int(input_ids.shape[-1])) from err

    # ------------------------------------------------------------------ scoring
    @torch.inference_mode()
    def score(self, context: Context, candidates: Sequence[str], action_prefix: str) -> CandidateScores:
        """Score each candidate as a continuation of ``render(context, action_prefix)``.

        Returns:
            CandidateScores with ``log_q`` [M] float32 (nats), ``n_tokens`` [M] int32 and
            ``hidden`` [M, hidden_size] float32 (LM-head input at the final action token).

        Raises:
            ValueError: empty candidate list, an empty (or non-string) candidate, a candidate with
                no tokens of its own, nothing to condition on, or context plus candidate longer
                than ``max_context_tokens``.
        """
        return self._score(context, candidates, action_prefix)

    @torch.inference_mode()
    def score_with_layers(self, context: Context, candidates: Sequence[str], action_prefix: str,
                          layers: Sequence[tuple[int, str]]) -> CandidateScores:
        """:meth:`score`, with inner layers' states at the candidates' action tokens taken from the
        same forward pass (``layers`` entries as in :meth:`candidate_states`: ``(layer, pool)``),
        in the result's ``layers`` (float32 [M, hidden_size] each, keyed by the entry).

        Raises:
            ValueError: a layer outside [-L, L], an unknown pool, or what :meth:`score` raises.
        """
        return self._score(context, candidates, action_prefix, [(self._layer_module(k), pool, (k, pool))
                                                                 for k, pool in layers])

    def _layer_module(self, layer: int) -> torch.nn.Module:
        """The module whose output is layer ``layer`` (0: the embeddings; negative from the end)."""
        layers = self.model.get_decoder().layers
        (k,) = self.check_layers([(layer, "last")], len(layers))
        return self.model.get_input_embeddings() if k == 0 else layers[k - 1]

    @torch.inference_mode()
    def score_on_device(self, context: Context, candidates: Sequence[str], action_prefix: str) -> DeviceScores:
        """:meth:`score`'s log q and hidden states left on the model's device, padded to
        :func:`agent_shell.lm.buckets.slots` (M) slots and handed to JAX without a copy (DLPack):
        what :meth:`decide` reads. The same pass as :meth:`score`, with no value read back to the
        host and no synchronisation before the decision.

        Raises:
            ValueError, ContextWindowFull: as :meth:`score`.
        """
        from agent_shell.lm.buckets import slots
        from agent_shell.lm.decision import as_jax

        toks, log_q, hidden, _ = self._pass(context, candidates, action_prefix)
        m = len(toks)
        pad = slots(m) - m
        n_tokens = np.ones(m + pad, np.int32)
        n_tokens[:m] = [t.n_action for t in toks]
        return DeviceScores(as_jax(torch.nn.functional.pad(log_q, (0, pad))),
                            as_jax(torch.nn.functional.pad(hidden, (0, 0, 0, pad))), n_tokens, m)

    def _score(self, context: Context, candidates: Sequence[str], action_prefix: str,
               capture: Sequence[tuple[torch.nn.Module, str, tuple[int, str]]] = ()) -> CandidateScores:
        """:meth:`score`, and for each ``capture`` entry ``(module, pool, key)`` the module's output
        in the candidates' pass at each candidate's action tokens, pooled (float32 [M, d]), in
        ``layers[key]``."""
        toks, log_q, hidden, states = self._pass(context, candidates, action_prefix, capture)
        return CandidateScores(log_q=log_q.cpu().numpy(), n_tokens=np.array([t.n_action for t in toks], np.int32),
                               hidden=hidden.cpu().numpy(), layers=states)

    def _pass(self, context: Context, candidates: Sequence[str], action_prefix: str,
              capture: Sequence[tuple[torch.nn.Module, str, tuple[int, str]]] = ()
              ) -> tuple[Sequence[TokenizedContinuation], torch.Tensor, torch.Tensor, dict]:
        """The candidates' tokens and their pass: (toks, log_q [M] and hidden [M, d] float32 on the
        device, the captured layers' pooled states on the host)."""
        self.check_layers([(0, pool) for _, pool, _ in capture], 0)
        toks, s = self.scoring_tokens(context, candidates, action_prefix)  # s: all shared tokens but the last
        offset = 0  # context tokens leading the candidates' pass (tree and packed layouts)
        with contextlib.ExitStack() as stack:
            hooked = [stack.enter_context(captured_output(module)) for module, _, _ in capture]
            if self.candidate_layout != "batched":
                (log_q, hidden), offset = self._score_in_one_pass(toks, s)
            else:
                cache = self.cache.prefill(toks[0].ids[:s], self._forward)
                saved = snapshot(cache) if self.cache.cache is cache else None
                try:
                    log_q, hidden = score_batched(self._forward, self._head, cache, s, toks,
                                                  self.tokenizer.pad_token_id, self.device)
                finally:
                    if saved is not None:
                        restore(cache, saved)
        states = {}
        if capture:  # outputs[-1]: the candidates' pass, [B, T, d]
            positions = action_positions(toks, s, self.candidate_layout, offset)
            states = {key: pool_states(outputs[-1], positions, pool)
                      for (_, pool, key), outputs in zip(capture, hooked)}
        return toks, log_q, hidden, states

    def _score_in_one_pass(self, toks: Sequence[TokenizedContinuation],
                           s: int) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
        """Tree (or packed) scoring with the context's uncached tokens in the same forward pass as the
        candidates (one pass per step, as its floor); the stream then keeps the context's ``s``
        tokens. A context with more than a prefill chunk (:data:`~agent_shell.lm.kv_cache.PREFILL_CHUNK`) of new tokens encodes the excess first.
        Returns ((log_q, hidden) on the device, the number of context tokens leading that pass)."""
        ids = toks[0].ids
        cache, lo = self.start_context(ids, s)
        out = score_packed(self._forward, self._head, cache, s, toks, self.dtype, self.device, start=lo,
                           layout=self.candidate_layout)
        self.keep_context(cache, ids, s)
        return out, s - lo

    # ------------------------------------------------------------------ generation
    @torch.inference_mode()
    def generate(self, prompt: Context, max_new_tokens: int = 64, stop: Sequence[str] = (), temperature: float = 0.0,
                 n: int = 1, seed: int | None = None) -> list[str]:
        """Return ``n`` continuations of ``render_prompt(prompt)`` (:mod:`agent_shell.lm.decoding`).

        Greedy when ``temperature == 0`` (then the ``n`` replies are identical), else sampled with
        ``seed``. The prompt's KV cache is kept, so a next prompt that extends it (a ReAct
        episode) only encodes its new tokens.

        Raises:
            ValueError: ``n < 1``, ``max_new_tokens < 0``, ``temperature < 0``, an empty stop
                string, an empty rendered prompt, or a prompt that fills the window.
        """
        stop = check_generation(max_new_tokens, stop, temperature, n)
        ids, budget = self.prompt_ids(prompt, max_new_tokens)
        if budget == 0:
            return [""] * n
        rows = n if temperature > 0 else 1
        generator = sampler(temperature, seed, self.device)
        # the prompt's new tokens (at least its last one) in one pass; the cache stays detached
        # until generation finishes cleanly
        cache, start = self.cache.start(ids[:-1])
        out = self.cache.encode(cache, ids, start, self._forward)
        prompt_kv = snapshot(cache) if self.cache.reusable(cache) else None
        plain = self.cache.ops.truncatable(cache)  # drafts cut the cache back; shared rows read its layers as they are
        texts = decode(self._forward, self.tokenizer, self._eos_ids, cache, out.logits[:, -1].float(), len(ids), rows,
                       budget, stop, temperature, generator, self.device, prompt_ids=ids,
                       draft_tokens=self.draft_tokens if plain else 0, shared=self._shared if plain else None)
        if prompt_kv is not None:
            restore(cache, prompt_kv)
            self.cache.keep(cache, ids)
        return texts if rows == n else texts * n


__all__ = ["HFLanguageModel", "choose_attention"]
