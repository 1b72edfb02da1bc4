"""JAX backend of :class:`agent_shell.lm.protocol.LanguageModel`: the Flax NNX decoder of
:mod:`agent_shell.lm.jax_model` behind the PyTorch backend's text side.

Rendering, tokenization, the candidates' layout (prefix tree, head rows), the prefix cache's
bookkeeping (the stream, pinned heads, prefill chunks) and the
decoding loops (prompt-lookup drafts, stop strings, end of sequence) are the PyTorch backend's own
code (:class:`~agent_shell.lm.tokenized.TokenizedBackend`, :mod:`~agent_shell.lm.layout`,
:class:`~agent_shell.lm.kv_cache.PrefixCache`, :mod:`~agent_shell.lm.decoding`); only the forward
passes differ. So the two backends score the same tokens in the same layout, and their numbers
agree to float32 rounding (the tests of ``tests/lm`` run on both backends).

The parts live in one module each: :mod:`~agent_shell.lm.jax_devices` (where the weights live, in
which dtype), :mod:`~agent_shell.lm.buckets` (the sizes passes are padded to),
:mod:`~agent_shell.lm.jax_programs` (the compiled programs, one store per decoder) and
:mod:`~agent_shell.lm.jax_kv` (the streams' KV buffers). This class wires them to one decoder and
tokenizer.

**Static shapes.** Every pass runs a compiled program whose shapes are rounded up to buckets,
padded with tokens no real token attends to; attention reads a buffer's filled slots only (a
run-time length), so a program serves every context its buffer holds, and an episode compiles a
bounded number of programs (:attr:`JaxLanguageModel.programs` counts them).

**A decision is one program** (:meth:`JaxLanguageModel.decide`; a step with more new context tokens
than a prefill chunk encodes the excess first): the context's new tokens and the candidates' prefix
tree in one pass over the stream's donated buffer, each candidate's log q and
hidden state gathered, the concept's terms and their argmax, and the record the results keep packed
into one array: the one fetch of a step's decision, after the argmax.

Not implemented (refused in one line): the shared LM server's batched calls
(:mod:`agent_shell.lm.batched`, ``--shared-lm``). Sampled replies draw from JAX's random streams,
so a seed gives other replies than the PyTorch backend's.

Must not import the agents, the environments or torch.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agent_shell.lm.buckets import MIN_CAPACITY, Sizes, bucket, capacity, padded, slots
from agent_shell.lm.decision import decide_scores
from agent_shell.lm.decoding import DRAFT_TOKENS, check_generation, greedy_with_drafts, reply_rows
from agent_shell.lm.jax_devices import resolve_jax_devices, resolve_jax_dtype
from agent_shell.lm.jax_mesh import Placement
from agent_shell.lm.jax_kv import JaxKV, StreamKV
from agent_shell.lm.jax_model import Decoder, load_decoder
from agent_shell.lm.jax_programs import CandidateSlots, Pass, Programs
from agent_shell.lm.layout import action_positions, batched_head_rows, candidate_tree, head_rows
from agent_shell.lm.protocol import CandidateScores, Context, Decided, DecisionHead, DeviceScores
from agent_shell.lm.scores import fetch
from agent_shell.lm.records import RowsInputs, StreamOutput, pack, read_decision
from agent_shell.lm.tokenization import TokenizedContinuation
from agent_shell.lm.tokenized import TokenizedBackend, load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: Per candidate, (row, the indices of its action tokens among the pass's tokens).
Positions = list[tuple[int, list[int]]]
#: An inner layer wanted from the candidates' pass: (its index 0..L, pool, the caller's key).
Capture = Sequence[tuple[int, str, tuple[int, str]]]


class JaxLanguageModel(TokenizedBackend):
    """A frozen Flax NNX decoder that scores candidate sets and generates text, as
    :class:`agent_shell.lm.hf.HFLanguageModel` does (the same arguments, layouts and numbers).

    Args:
        decoder: a loaded :class:`agent_shell.lm.jax_model.Decoder`; ``tokenizer``: its tokenizer.
        eos_token_ids: end-of-sequence ids of the model's generation config (the tokenizer's are
            added).
        max_context_tokens: the window; default the config's ``max_position_embeddings``.
        name, candidate_layout, reuse_cache, max_heads, draft_tokens: as
            :class:`agent_shell.lm.hf.HFLanguageModel`'s.

    Raises:
        ValueError: unknown candidate layout, negative ``draft_tokens``, or an unknown window.
    """

    def __init__(self, decoder: Decoder, tokenizer: PreTrainedTokenizerBase, *, name: str,
                 eos_token_ids: Sequence[int] = (), max_context_tokens: int | None = None,
                 candidate_layout: str = "tree", reuse_cache: bool = True, max_heads: int = 16,
                 draft_tokens: int = DRAFT_TOKENS) -> None:
        self.decoder = decoder
        self.config = decoder.config
        self.hidden_size: int = decoder.config.hidden_size
        self._set_text(tokenizer, name, max_context_tokens or decoder.config.max_position_embeddings or None)
        self.programs = Programs.of(decoder)
        self.placement: Placement = self.programs.placement  # the devices the weights are on (a mesh of one or more)
        self.device: jax.Device = self.placement.devices[0]
        self.dtype = jnp.dtype(decoder.dtype)
        eos = set(int(i) for i in eos_token_ids)
        value = getattr(tokenizer, "eos_token_id", None)
        eos.update([value] if isinstance(value, int) else (value or []))
        self._eos_ids = frozenset(eos)
        self._set_options(candidate_layout, reuse_cache, max_heads, draft_tokens)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, name: str | None = None, dtype: str = "auto",
                        device: str | None = None, **kwargs: Any) -> "JaxLanguageModel":
        """Load a HuggingFace model folder (``config.json``, safetensors weights, tokenizer files).

        Args:
            path: the folder.
            name: identifier for concept metadata; default ``str(path)``.
            dtype: ``"auto"``, ``"float32"`` or ``"bfloat16"`` (:func:`resolve_jax_dtype`).
            device: one device or a mesh of several, as :func:`resolve_jax_devices` names them
                (:data:`agent_shell.lm.jax_devices.DEVICE_SYNTAX`).
            kwargs: see the class.

        Raises:
            FileNotFoundError: no config.json, no safetensors weights or no tokenizer in ``path``.
            agent_shell.lm.jax_model.UnsupportedModel: an architecture the decoder does not implement.
            agent_shell.lm.model_config.BadModelFolder: the folder disagrees with its weights or
                holds a broken file (:func:`agent_shell.lm.model_folder.check_model_folder`).
            ValueError: an unknown dtype or device, or a mesh that does not divide the heads or the MLP's hidden axis.
        """
        from agent_shell.lm.model_config import generation_eos
        from agent_shell.lm.model_folder import check_model_folder

        placement = Placement.over(resolve_jax_devices(device))
        jdtype = resolve_jax_dtype(dtype, placement.devices[0])
        check_model_folder(path, "jax")  # the folder against its weights, before anything loads
        tokenizer = load_tokenizer(path)
        decoder = load_decoder(path, dtype=jdtype, placement=placement)
        return cls(decoder, tokenizer, name=name or str(path), eos_token_ids=generation_eos(path), **kwargs)

    def cache_ops(self) -> JaxKV:
        """The KV buffers of this decoder's programs."""
        return JaxKV(self.programs)

    @property
    def program_count(self) -> int:
        """How many distinct compiled programs this backbone's passes have used so far."""
        return len(self.programs.compiled)

    # ------------------------------------------------------------------ passes
    def _forward(self, ids: Sequence[int], cache: StreamKV, start: int) -> StreamOutput:
        """A causal pass over ``ids`` after the ``start`` tokens ``cache`` holds (a chunk of a
        context or prompt); the head runs at its last token."""
        n = len(ids)
        p = Pass(list(ids), list(range(start, start + n)), start, np.tril(np.ones((n, n), bool)), [n - 1])
        return self._run(cache, p, "stream", p.stream_inputs())

    def _run(self, cache: StreamKV, p: Pass, program: str, inputs: tuple[Sizes, np.ndarray, np.ndarray],
             *extra: Any, static: tuple = ()) -> Any:
        """Run ``program`` on pass ``p``'s padded ``inputs`` (:meth:`Pass.stream`, :meth:`Pass.score`,
        :meth:`Pass.decide`) over ``cache`` (batch 1), then ``extra`` arguments; ``cache`` then holds
        ``p.at`` + the pass's tokens (cut it back to keep fewer). Returns the program's outputs after
        the buffer."""
        sizes, ints, mask = inputs
        kv = self.cache.ops.writable(cache, p.at + sizes.t)
        kv, out = self.programs.run(program, (sizes, *static), kv, ints, mask, *extra)
        cache.kv, cache.length, cache.owned = kv, p.at + len(p.tokens), True
        return out

    # ------------------------------------------------------------------ scoring
    def score(self, context: Context, candidates: Sequence[str], action_prefix: str) -> CandidateScores:
        """Score each candidate as a continuation of ``render(context, action_prefix)``
        (:meth:`agent_shell.lm.hf.HFLanguageModel.score`): :meth:`score_on_device`, fetched.

        Returns:
            CandidateScores with ``log_q`` [M] float32 (nats), ``n_tokens`` [M] int32 and
            ``hidden`` [M, hidden_size] float32 (LM-head input at the final action token).

        Raises:
            ValueError: empty candidate list, an empty (or non-string) candidate, a candidate with
                no tokens of its own, or nothing to condition on.
            ContextWindowFull: context plus candidate longer than ``max_context_tokens``.
        """
        return self._score(context, candidates, action_prefix, [])

    def score_on_device(self, context: Context, candidates: Sequence[str], action_prefix: str) -> DeviceScores:
        """:meth:`score`'s log q and hidden states left on the backend's device, padded to
        :func:`agent_shell.lm.buckets.slots` (M) slots: one program (the pass and the gather),
        nothing fetched. The token log-probabilities are summed in float32 on the device.

        Raises:
            ValueError, ContextWindowFull: as :meth:`score`.
        """
        toks, log_q, hidden, _, _ = self._scores(context, candidates, action_prefix, [])
        return DeviceScores(log_q, hidden, padded([t.n_action for t in toks], log_q.shape[0], fill=1), len(toks))

    def decide(self, context: Context, candidates: Sequence[str], action_prefix: str,
               decision_head: DecisionHead) -> Decided:
        """The decision under ``decision_head`` (:func:`agent_shell.lm.decision.decide`) in ONE
        program (tree and packed layouts): the context's new tokens and the candidates' tree in one
        pass over the stream's donated buffer, the gather, the head's kernel and its record
        (:func:`agent_shell.lm.records.pack_decision`), which is the one array fetched. The batched
        layout scores first (:meth:`score_on_device`), then decides.

        Raises:
            ValueError, ContextWindowFull: as :meth:`score`; a head whose width is not hidden_size;
                non-finite scores (naming the candidate).
        """
        if self.candidate_layout == "batched":
            return decide_scores(decision_head, self.score_on_device(context, candidates, action_prefix))
        parameters = self.programs.parameters(decision_head, self.hidden_size)
        toks, s = self.scoring_tokens(context, candidates, action_prefix)
        cache, p, (_, _, owner, final_rows), _ = self._tree_pass(toks, s, [])
        n_tokens = [t.n_action for t in toks]
        out = self._run(cache, p, "decide", p.decide_inputs(CandidateSlots(owner, final_rows, n_tokens)), parameters,
                        static=(decision_head.kernel,))
        self.keep_context(cache, toks[0].ids, s)
        scores = DeviceScores(out.log_q, out.hidden, padded(n_tokens, out.log_q.shape[0], fill=1), len(toks))
        return read_decision(fetch(out.record), len(toks), scores.fetched, decision_head)

    def score_with_layers(self, context: Context, candidates: Sequence[str], action_prefix: str,
                          layers: Sequence[tuple[int, str]]) -> CandidateScores:
        """:meth:`score`, with inner layers' states at the candidates' action tokens from the same
        pass (:meth:`agent_shell.lm.hf.HFLanguageModel.score_with_layers`).

        Raises:
            ValueError: a layer outside [-L, L], an unknown pool, or what :meth:`score` raises.
        """
        ks = self.check_layers(layers, self.config.num_layers)
        return self._score(context, candidates, action_prefix, [(k, pool, (layer, pool))
                                                                for k, (layer, pool) in zip(ks, layers)])

    def _score(self, context: Context, candidates: Sequence[str], action_prefix: str,
               capture: Capture) -> CandidateScores:
        toks, log_q, hidden, captured, positions = self._scores(context, candidates, action_prefix, capture)
        m = len(toks)
        log_q, hidden = fetch(log_q), fetch(hidden)
        states = {}
        if capture:
            wanted = sorted({c for _, cols in positions for c in cols})
            at = {c: i for i, c in enumerate(wanted)}
            captured = fetch(captured)
            for j, (_, pool, key) in enumerate(capture):
                rows = [captured[j, [at[c] for c in cols]] for _, cols in positions]
                states[key] = np.stack([r.mean(0) if pool == "mean" else r[-1] for r in rows]).astype(np.float32)
        return CandidateScores(log_q=np.array(log_q[:m], np.float32), hidden=np.array(hidden[:m], np.float32),
                               n_tokens=np.array([t.n_action for t in toks], np.int32), layers=states)

    def _scores(self, context: Context, candidates: Sequence[str], action_prefix: str, capture: Capture
                ) -> tuple[Sequence[TokenizedContinuation], jax.Array, jax.Array, jax.Array, Positions]:
        """The candidates' tokens (checked) and their one program in this backend's layout: (the
        tokens, log q [M_pad] and hidden [M_pad, D] on the device, the captured layers' states, the
        captured tokens of each candidate)."""
        toks, s = self.scoring_tokens(context, candidates, action_prefix)
        if self.candidate_layout == "batched":
            return (toks, *self._score_rows(toks, s, capture, slots(len(toks))))
        cache, p, (_, _, owner, final_rows), positions = self._tree_pass(toks, s, capture)
        log_q, hidden, captured = self._run(cache, p, "score", p.score_inputs(CandidateSlots(owner, final_rows)))
        self.keep_context(cache, toks[0].ids, s)
        return toks, log_q, hidden, captured, positions

    def _tree_pass(self, toks: Sequence[TokenizedContinuation], s: int,
                   capture: Capture) -> tuple[StreamKV, Pass, tuple[list[int], ...], Positions]:
        """The tree (or packed) pass, the context's uncached tokens leading it
        (:meth:`agent_shell.lm.hf.HFLanguageModel._score_in_one_pass`), ready to run on the stream's
        cache (encoded up to the pass's first token): (the cache, the pass, the head rows' roles,
        the captured tokens of each candidate)."""
        ids = toks[0].ids
        cache, lo = self.start_context(ids, s)
        tree = candidate_tree(toks, s, self.candidate_layout)
        needed, rows = head_rows(toks, tree, s)
        n_head, n = s - lo, s - lo + len(tree.tokens)
        allowed = np.zeros((n, n), bool)
        allowed[:n_head, :n_head] = np.tri(n_head, dtype=bool)
        allowed[n_head:, :n_head] = True
        allowed[n_head:, n_head:] = tree.ancestry()
        positions = action_positions(toks, s, self.candidate_layout, n_head) if capture else []
        wanted = sorted({c for _, cols in positions for c in cols})
        pred_rows, targets, _, _ = rows
        p = Pass(list(ids[lo:s]) + tree.tokens, list(range(lo, s)) + [s + d for d in tree.depths], lo, allowed,
                 [n_head + node for node in needed], (pred_rows, targets), wanted, [k for k, _, _ in capture])
        return cache, p, rows, positions

    def _score_rows(self, toks: Sequence[TokenizedContinuation], s: int, capture: Capture,
                    m_pad: int) -> tuple[jax.Array, jax.Array, jax.Array, Positions]:
        """The batched layout: one right-padded row per candidate over the context's cache, read
        once for all rows."""
        cache = self.cache.prefill(toks[0].ids[:s], self._forward)
        segs = [t.ids[s:] for t in toks]
        width, n_rows = bucket(max(len(g) for g in segs)), bucket(len(segs))
        ids = np.zeros((n_rows, width), np.int32)
        for b, g in enumerate(segs):
            ids[b, :len(g)] = g
        head, (pred_rows, targets, owner, final_rows) = batched_head_rows(toks, s, width)
        positions = [(b, [b * width + c for c in cols]) for b, cols in action_positions(toks, s, "batched")]
        wanted = sorted({c for _, cols in positions for c in cols}) if capture else []
        shared = cache.kv if cache.kv is not None else self.cache.ops.buffer(1, MIN_CAPACITY)
        sizes = Sizes((n_rows, width), bucket(len(head)), bucket(len(pred_rows)),
                      bucket(len(wanted)) if wanted else 0, len(capture), m_pad)
        record = RowsInputs(ids, s, padded(head, sizes.k), padded(pred_rows, sizes.p), padded(targets, sizes.p),
                            padded(owner, sizes.p, fill=m_pad), padded(final_rows, m_pad), padded(wanted, sizes.c),
                            [k for k, _, _ in capture])
        _, (log_q, hidden, captured) = self.programs.run("rows", (sizes,), self.cache.ops.buffer(n_rows, width),
                                                         shared, pack(record, sizes))
        return log_q, hidden, captured, positions

    # ------------------------------------------------------------------ generation
    def generate(self, prompt: Context, max_new_tokens: int = 64, stop: Sequence[str] = (), temperature: float = 0.0,
                 n: int = 1, seed: int | None = None) -> list[str]:
        """Return ``n`` continuations of ``render_prompt(prompt)``
        (:meth:`agent_shell.lm.hf.HFLanguageModel.generate`): greedy when ``temperature == 0``
        (prompt-lookup drafts, the ``n`` replies identical), else ``n`` seeded samples drawn with
        JAX's random streams over one copy of the prompt's cache. The prompt's KV cache is kept.

        Raises:
            ValueError: ``n < 1``, ``max_new_tokens < 0``, ``temperature < 0``, an empty stop
                string, or an empty rendered prompt.
            ContextWindowFull: a prompt that fills the window.
        """
        stop = check_generation(max_new_tokens, stop, temperature, n)
        ids, budget = self.prompt_ids(prompt, max_new_tokens)
        if budget == 0:
            return [""] * n
        if temperature > 0:
            return self._sample(ids, budget, stop, temperature, n, seed)
        cache, start = self.cache.start(ids[:-1])
        out = self.cache.encode(cache, ids, start, self._forward)
        first = out.first_greedy()

        def verify(feed: list[int], cached: int) -> list[int]:
            m = len(feed)
            p = Pass(feed, list(range(cached, cached + m)), cached, np.tril(np.ones((m, m), bool)), list(range(m)))
            greedy = self._run(cache, p, "stream", p.stream_inputs()).greedy
            return fetch(greedy)[:m].tolist()

        def cut(length: int) -> None:
            self.cache.ops.cut(cache, length)

        if self.draft_tokens > 0:
            text = greedy_with_drafts(first, verify, cut, self.tokenizer, self._eos_ids, list(ids), budget, stop,
                                      self.draft_tokens)
        else:
            (text,) = reply_rows([first], lambda tokens, step: verify(tokens, len(ids) + step), budget, stop,
                                 self.tokenizer, self._eos_ids)
        self.cache.ops.cut(cache, len(ids))
        if self.cache.reusable(cache):
            self.cache.keep(cache, ids)
        return [text] * n

    def _sample(self, ids: list[int], budget: int, stop: Sequence[str], temperature: float, n: int,
                seed: int | None) -> list[str]:
        """``n`` sampled replies: the prompt but its last token from the stream's cache, then every
        row feeds the last prompt token and its own draws, reading the prompt's buffer in place."""
        cache, start = self.cache.start(ids[:-1])
        self.cache.encode(cache, ids[:-1], start, self._forward)
        shared = cache.kv if cache.kv is not None else self.cache.ops.buffer(1, MIN_CAPACITY)
        state = {"rows": self.cache.ops.buffer(n, capacity(budget, least=1))}
        key = jax.random.PRNGKey(secrets.randbits(63) if seed is None else int(seed))
        base = len(ids) - 1

        def advance(tokens: list[int], step: int) -> list[int]:
            state["rows"], drawn = self.programs.run(
                "sample", (), state["rows"], shared, np.int32(base), np.asarray(tokens, np.int32)[:, None],
                np.full((n, 1), base + step, np.int32), np.int32(step), key, np.int32(step),
                np.float32(temperature))
            return fetch(drawn).tolist()

        first = advance([ids[-1]] * n, 0)
        texts = reply_rows(first, lambda tokens, step: advance(tokens, step + 1), budget, stop, self.tokenizer,
                           self._eos_ids)
        if self.cache.reusable(cache) and len(ids) > 1:
            self.cache.keep(cache, ids[:-1])
        return texts


def jax_model_folder(arg: str | None) -> Path:
    """The model folder of ``--model jax:ARG``: ``ARG`` a HuggingFace model folder, a hub name
    already in the HuggingFace cache, or empty (or a default alias) for the offline default
    backbone (:func:`agent_shell.lm.default_model.default_model_dir`, the same folder the PyTorch
    backend loads).

    Raises:
        agent_shell.lm.default_model.ModelNotFoundError: the model cannot be found.
    """
    from agent_shell.lm.default_model import DEFAULT_MODEL_ALIASES, default_model_dir

    if not arg or arg.lower() in DEFAULT_MODEL_ALIASES:
        return Path(default_model_dir())
    path = Path(arg).expanduser()
    if not path.is_dir():
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(arg, local_files_only=True))
    return path


def load_jax_model(arg: str | None, *, dtype: str = "auto", device: str | None = None,
                   **kwargs: Any) -> JaxLanguageModel:
    """The backend of ``--model jax:ARG`` (the folder :func:`jax_model_folder` finds).

    Raises:
        agent_shell.lm.default_model.ModelNotFoundError: the model cannot be found.
        agent_shell.lm.jax_model.UnsupportedModel: an architecture the decoder does not implement.
        ValueError: an unknown dtype or device, or a mesh that does not divide the model's heads.
    """
    from agent_shell.lm.default_model import DEFAULT_MODEL_ALIASES, DEFAULT_MODEL_NAME

    default = not arg or arg.lower() in DEFAULT_MODEL_ALIASES
    return JaxLanguageModel.from_pretrained(jax_model_folder(arg), name=DEFAULT_MODEL_NAME if default else arg,
                                            dtype=dtype, device=device, **kwargs)


__all__ = ["JaxLanguageModel", "jax_model_folder", "load_jax_model"]
