"""JAX backend of :class:`agent_shell.lm.protocol.LanguageModel`: the Flax NNX decoder of
:mod:`agent_shell.lm.jax_model` behind the PyTorch backend's text side.

Rendering, tokenization, the candidates' layout (prefix tree, head rows), the prefix cache's
bookkeeping (the stream, pinned heads, :data:`~agent_shell.lm.kv_cache.PREFILL_CHUNK`) and the
decoding loops (prompt-lookup drafts, stop strings, end of sequence) are the PyTorch backend's own
code (:class:`~agent_shell.lm.tokenized.TokenizedBackend`, :mod:`~agent_shell.lm.layout`,
:class:`~agent_shell.lm.kv_cache.PrefixCache`, :mod:`~agent_shell.lm.decoding`); only the forward
passes differ. So the two backends score the same tokens in the same layout, and their numbers
agree to float32 rounding (the tests of ``tests/lm`` run on both backends).

**Static shapes.** Every pass runs a compiled program whose shapes are rounded up to buckets
(:func:`bucket`: 1, 2, 4, 8, 16, 24, 32, 48, ..., 512 tokens, rows and head rows, then multiples
of 256; KV buffers of a power of two slots, at least 256), padded with tokens no real token
attends to. Attention reads a buffer's filled slots only (a run-time length), so a program serves
every context its buffer holds. An episode compiles a bounded number of programs
(:attr:`JaxLanguageModel.programs` counts them); with :func:`cb_core.cache.enable_persistent_cache`
on, they are kept as digest-checked serialized executables (:func:`cb_core.cache.call_compiled`)
and a new process loads them instead of compiling.

**Caches.** A stream's keys and values live in one buffer per stream ([L, 1, Hkv, C, hd]) that a
pass updates in place (donated); pinned heads keep the buffer they were taken from, and a stream
that starts from a head copies it before its first write (:class:`JaxKV`). Sampled replies read
the prompt's buffer once for all rows, their own tokens going to a small per-row buffer (the
cascade/Hydragen decomposition of :mod:`agent_shell.lm.shared_prefix`).

Not implemented (refused in one line): the shared LM server's batched calls
(:mod:`agent_shell.lm.batched`, ``--shared-lm``). Sampled replies draw from JAX's random streams,
so a seed gives other replies than the PyTorch backend's.

Must not import the agents, the environments or torch.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import hashlib
import os
import secrets
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agent_shell.lm.decoding import DRAFT_TOKENS, check_generation, greedy_with_drafts, reply_rows
from agent_shell.lm.jax_model import KV, Decoder, load_decoder
from agent_shell.lm.jax_platforms import check_jax_platforms
from agent_shell.lm.kv_cache import PREFILL_CHUNK, HeadStore, PrefixCache
from agent_shell.lm.layout import CANDIDATE_LAYOUTS, action_positions, batched_head_rows, candidate_tree, head_rows
from agent_shell.lm.protocol import BackboneFault, CandidateScores, Context
from agent_shell.lm.tokenization import TokenizedContinuation
from agent_shell.lm.tokenized import TokenizedBackend

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: Sizes a pass's tokens, rows, head rows and token pairs are rounded up to: 1, 2, 4, 8, 16, 24, 32,
#: 48, ..., 384, 512 (powers of two and three times powers of two), then every multiple of 256: at
#: most a third is padding, and at most an eighth past 2,048 (a long context's first pass).
BUCKETS = tuple(sorted({1, 2, 4} | {2**k for k in range(3, 10)} | {3 * 2**k for k in range(3, 8)}
                       | {256 * k for k in range(2, 4097)}))
#: The fewest slots a stream's KV buffer holds (buffers grow by doubling). Attention reads only a
#: buffer's filled slots, so a roomy buffer costs memory (about 47 MB for the default backbone in
#: float32), not time, and an episode's growing context crosses fewer capacities (each a program).
MIN_CAPACITY = 1024


def bucket(n: int) -> int:
    """The smallest size in :data:`BUCKETS` that holds ``n`` (>= 1) items."""
    return int(BUCKETS[bisect.bisect_left(BUCKETS, max(n, 1))])


def capacity(n: int, least: int = MIN_CAPACITY) -> int:
    """The slots of a KV buffer holding ``n`` tokens: a power of two, at least ``least``."""
    return max(least, 1 << max(n - 1, 0).bit_length())


# ---------------------------------------------------------------------------------------- devices
def resolve_jax_device(device: str | None = None) -> jax.Device:
    """The JAX device named by ``device``: None/``"auto"`` (JAX's default device), ``"cpu"``,
    ``"cuda"``/``"gpu"``, ``"tpu"``, each optionally ``:N``.

    Raises:
        ValueError: another name, a device JAX does not see here (one line listing what it sees),
            or a ``JAX_PLATFORMS`` setting JAX cannot start
            (:func:`agent_shell.lm.jax_platforms.check_jax_platforms`).
    """
    check_jax_platforms()
    name = "auto" if device is None else str(device).strip().lower()
    if name == "auto":
        return jax.devices()[0]
    kind, _, index = name.partition(":")
    platform = {"cuda": "gpu", "gpu": "gpu", "cpu": "cpu", "tpu": "tpu"}.get(kind)
    if platform is None or (index and not index.isdigit()):
        raise ValueError(f"device={device!r} is not one of auto, cpu, cuda, gpu, tpu (optionally :N)")
    try:
        found = jax.devices(platform)
    except RuntimeError:
        found = []
    seen = ", ".join(sorted({str(d.platform) for d in jax.devices()}))
    if not found:
        raise ValueError(f"device={device!r}: JAX sees no {platform} device here (it sees: {seen})")
    k = int(index or 0)
    if k >= len(found):
        raise ValueError(f"device={device!r}: JAX sees {len(found)} {platform} device(s), numbered 0 to "
                         f"{len(found) - 1}")
    return found[k]


def jax_device_name(device: str | None = None) -> str:
    """:func:`resolve_jax_device` as the name recorded and passed on: ``"cpu"``, ``"cuda"``,
    ``"tpu"``, with ``":N"`` past the first device of a kind (``"auto"`` becomes the kind JAX
    uses by default).

    Raises:
        ValueError: as :func:`resolve_jax_device`.
    """
    found = resolve_jax_device(device)
    kind = {"gpu": "cuda"}.get(found.platform, found.platform)
    index = jax.devices(found.platform).index(found)
    return kind if index == 0 else f"{kind}:{index}"


def jax_dtype_name(dtype: str, device: str | None = None) -> str:
    """:func:`resolve_jax_dtype` on the device ``device`` names, as the name recorded in results
    and concepts (``"float32"``, ``"bfloat16"``).

    Raises:
        ValueError: an unknown dtype or device.
    """
    return str(jnp.dtype(resolve_jax_dtype(dtype, resolve_jax_device(device))))


def resolve_jax_dtype(dtype: str, device: jax.Device) -> Any:
    """``"auto"``, ``"float32"``/``"fp32"`` or ``"bfloat16"``/``"bf16"`` as a JAX dtype on ``device``.

    ``"auto"`` follows :func:`agent_shell.lm.dtypes.resolve_dtype`: bfloat16 on GPUs and TPUs and
    on CPUs with native bfloat16 matmuls (:func:`agent_shell.lm.dtypes.native_bfloat16`), float32
    on other CPUs.

    Raises:
        ValueError: another name (float16 is not offered: the decoder runs float32 or bfloat16).
    """
    name = str(dtype).lower().removeprefix("torch.")
    if name == "auto":
        if device.platform != "cpu":
            return jnp.bfloat16
        from agent_shell.lm.dtypes import native_bfloat16

        return jnp.bfloat16 if native_bfloat16("cpu") else jnp.float32
    named = {"float32": jnp.float32, "fp32": jnp.float32, "bfloat16": jnp.bfloat16, "bf16": jnp.bfloat16}
    if name not in named:
        raise ValueError(f"dtype={dtype!r} is not 'auto', 'float32' or 'bfloat16' (the JAX backend's dtypes)")
    return named[name]


# ---------------------------------------------------------------------------------------- caches
@dataclass
class StreamKV:
    """A stream's KV buffer (batch 1, [L, 1, Hkv, C, hd] keys and values, or None before the first
    pass) and how many of its slots hold the stream's tokens. ``owned``: no pinned head shares the
    buffer, so a pass may update it in place."""

    kv: KV | None = None
    length: int = 0
    owned: bool = True


class JaxKV:
    """:class:`agent_shell.lm.kv_cache.CacheOps` of :class:`StreamKV` buffers (every layer is full
    attention: a cache is cut back by its length alone)."""

    def new(self) -> StreamKV:
        return StreamKV()

    def snapshot(self, cache: StreamKV) -> tuple[KV | None, int]:
        cache.owned = False  # the snapshot keeps the buffer: later passes write into a copy
        return cache.kv, cache.length

    def from_snapshot(self, saved: tuple[KV | None, int], length: int) -> StreamKV:
        return StreamKV(saved[0], min(length, saved[1]), owned=False)

    def cut(self, cache: StreamKV, length: int) -> None:
        cache.length = min(cache.length, length)

    def truncatable(self, cache: StreamKV) -> bool:
        return True

    def encode(self, forward: Any, cache: StreamKV, ids: Sequence[int], start: int) -> PassOutput:
        return forward(ids, cache, start)


@dataclass
class PassOutput:
    """What a pass returns (device arrays, fetched on demand): the head rows' hidden states
    (float32 [K, D], the LM head's input), greedy's token after each head row [K], the token
    pairs' log-probabilities float32 [P] and the captured layers' states float32 [NL, R, D]."""

    hidden: jax.Array
    greedy: jax.Array
    token_lp: jax.Array
    captured: jax.Array

    def first_greedy(self) -> int:
        """Greedy's token after the first head row (a prefill chunk's last token)."""
        return int(np.asarray(self.greedy)[0])


def _source_digest() -> str:
    """SHA-256 of this module's and the decoder's source: part of every stored program's name."""
    digest = hashlib.sha256()
    for module in (Path(__file__), Path(__file__).with_name("jax_model.py")):
        digest.update(module.read_bytes())
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------------------------------- programs
class Programs:
    """The compiled passes of one decoder, shared by every view (fork) of it.

    Each pass is a ``jax.jit`` function of the decoder's state (its weights) and arrays of bucketed
    shapes; :attr:`compiled` records every (pass, shapes) met, i.e. every program compiled or
    loaded by this process. With :func:`cb_core.cache.enable_persistent_cache` on, programs go
    through :func:`cb_core.cache.call_compiled` (stored, digest-checked executables).
    """

    _of: "weakref.WeakKeyDictionary[Decoder, Programs]" = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, decoder: Decoder) -> "Programs":
        """The programs of ``decoder`` (made once per decoder: every backend on it shares them)."""
        if decoder not in cls._of:
            cls._of[decoder] = cls(decoder)
        return cls._of[decoder]

    def __init__(self, decoder: Decoder):
        self.config = decoder.config
        self.dtype = decoder.dtype
        self.device: jax.Device = next(iter(decoder.embed[...].devices()))
        self.graphdef, self.state = nnx.split(decoder)
        self.compiled: dict[tuple, int] = {}
        self._name = f"lm-{self.config.model_type}-" + hashlib.sha256(
            (repr(self.config) + str(self.dtype) + _source_digest()).encode()).hexdigest()[:16]
        graphdef = self.graphdef

        def outputs(model: Decoder, x: jax.Array, head: jax.Array, pair_row: jax.Array, pair_target: jax.Array):
            """(hidden [K, D], greedy [K], token log-probs [P]) at the head rows of x [N, D]."""
            normed, logits = model.head(x[head])
            top = logits.max(-1, keepdims=True)
            log_norm = top[:, 0] + jnp.log(jnp.exp(logits - top).sum(-1))
            token_lp = logits[pair_row, pair_target] - log_norm[pair_row]
            return normed.astype(jnp.float32), jnp.argmax(logits, -1).astype(jnp.int32), token_lp

        def stream(state, kv, ids, positions, at, mask, head, pair_row, pair_target, capture, layers):
            model = nnx.merge(graphdef, state)
            x, kv, captured = model(ids, positions, kv, at, mask, capture=capture)
            hidden, greedy, token_lp = outputs(model, x.reshape(-1, x.shape[-1]), head, pair_row, pair_target)
            return kv, hidden, greedy, token_lp, captured[layers]

        def rows(state, kv, shared, shared_len, ids, positions, at, mask, head, pair_row, pair_target, capture,
                 layers):
            model = nnx.merge(graphdef, state)
            x, kv, captured = model(ids, positions, kv, at, mask, shared=shared, shared_len=shared_len,
                                    capture=capture)
            hidden, greedy, token_lp = outputs(model, x.reshape(-1, x.shape[-1]), head, pair_row, pair_target)
            return kv, hidden, greedy, token_lp, captured[layers]

        def sample(state, kv, shared, shared_len, ids, positions, at, key, step, temperature):
            model = nnx.merge(graphdef, state)
            x, kv, _ = model(ids, positions, kv, at, jnp.ones((1, 1, 1), bool), shared=shared, shared_len=shared_len)
            _, logits = model.head(x[:, -1])
            drawn = jax.random.categorical(jax.random.fold_in(key, step), logits / temperature, axis=-1)
            return kv, drawn.astype(jnp.int32)

        def gather(state, token_lp, hidden, owner, final_rows):
            """(log q [M_pad] float32, hidden [M_pad, D]) of a scoring pass's outputs, on the device:
            each candidate's token log-probabilities summed (pairs of ``owner`` M_pad are padding)
            and the LM head input at its final action token."""
            m_pad = final_rows.shape[0]
            log_q = jax.ops.segment_sum(token_lp, owner, num_segments=m_pad + 1)[:m_pad]
            return log_q, hidden[final_rows]

        def grow(state, kv, slots):
            pad = [(0, 0)] * 3 + [(0, slots.shape[0] - kv.keys.shape[3]), (0, 0)]
            return KV(jnp.pad(kv.keys, pad), jnp.pad(kv.values, pad))

        self._jitted = {"stream": jax.jit(stream, donate_argnums=1), "rows": jax.jit(rows, donate_argnums=1),
                        "sample": jax.jit(sample, donate_argnums=1), "grow": jax.jit(grow),
                        "gather": jax.jit(gather)}

    def run(self, name: str, *args: Any) -> Any:
        """Pass ``name`` on ``args`` (after the state), recording its shapes; through the
        executable store when one is enabled.

        Raises:
            agent_shell.lm.protocol.BackboneFault: the pass cannot be traced for these weights
                (shapes that do not fit): every later call would fail alike.
        """
        from cb_core.cache import call_compiled

        shapes = tuple((tuple(np.shape(a)), str(getattr(a, "dtype", ""))) for a in jax.tree.leaves(args))
        self.compiled[(name, shapes)] = self.compiled.get((name, shapes), 0) + 1
        jitted = self._jitted[name]
        example = {"stream": (KV(0, 0), 0, 0, 0, 0), "rows": (KV(0, 0), 0, 0, 0, 0), "sample": (KV(0, 0), 0),
                   "grow": KV(0, 0), "gather": (0, 0)}[name]
        try:
            return call_compiled(f"{self._name}-{name}", jitted, (), (self.state, *args), example)
        except (TypeError, ValueError, IndexError) as err:  # raised while tracing: the same shapes fail again
            raise BackboneFault.of(err, f"the JAX decoder's {name} pass") from err

    def buffer(self, batch: int, slots: int) -> KV:
        """An empty KV buffer: keys and values [L, batch, Hkv, slots, hd] in the model's dtype."""
        c = self.config
        shape = (c.num_layers, batch, c.num_kv_heads, slots, c.head_dim)
        with jax.default_device(self.device):
            return KV(jnp.zeros(shape, self.dtype), jnp.zeros(shape, self.dtype))

    def writable(self, cache: StreamKV, need: int) -> KV:
        """``cache``'s buffer, holding at least ``need`` slots, that a pass may update in place
        (grown, or copied when a pinned head shares it)."""
        if cache.kv is None:
            return self.buffer(1, capacity(need))
        slots = cache.kv.keys.shape[3]
        if need > slots:
            return self.run("grow", cache.kv, np.zeros(capacity(need), np.int8))
        if not cache.owned:
            return KV(cache.kv.keys.copy(), cache.kv.values.copy())
        return cache.kv


@dataclass(frozen=True)
class Pass:
    """One stream pass's inputs before padding: ``tokens`` at ``positions``, written after the
    ``at`` tokens the stream holds; ``allowed`` [n, n] which of them each one sees; the LM head
    at ``head`` (indices into the tokens); the (head row, target token) pairs whose
    log-probabilities are wanted; the token indices whose inner states are captured, and at
    which layers (0..L)."""

    tokens: list[int]
    positions: list[int]
    at: int
    allowed: np.ndarray
    head: list[int]
    pairs: tuple[list[int], list[int]] = ([], [])
    capture: list[int] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class DeviceScores:
    """A candidate set's scores on the backend's device (:meth:`JaxLanguageModel.score_on_device`),
    padded to M_pad slots of which the first ``count`` are the candidates.

    Attributes:
        log_q: [M_pad] float32 device array, summed action-token log-probabilities (nats; 0 in
            padded slots).
        hidden: [M_pad, D] float32 device array, the LM head input at each final action token.
        n_tokens: [M_pad] int32 numpy, action token counts (1 in padded slots).
        count: M.
    """

    log_q: jax.Array
    hidden: jax.Array
    n_tokens: np.ndarray
    count: int

    def fetched(self) -> CandidateScores:
        """The scores on the host, unpadded (as :meth:`JaxLanguageModel.score` returns them)."""
        log_q, hidden = jax.device_get((self.log_q, self.hidden))
        m = self.count
        return CandidateScores(log_q=np.asarray(log_q[:m], np.float32), n_tokens=self.n_tokens[:m].copy(),
                               hidden=np.asarray(hidden[:m], np.float32))


#: :func:`agent_shell.lm.layout.head_rows`' roles of the head rows: (rows predicting action
#: tokens, those tokens, their candidates, each candidate's final row), rows indexing the head rows.
Rows = tuple[list[int], list[int], list[int], list[int]]
#: Per candidate, (row, the indices of its action tokens among the pass's tokens).
Positions = list[tuple[int, list[int]]]


def _gather(out: PassOutput, rows: Rows, m_count: int) -> tuple[np.ndarray, np.ndarray]:
    """(log_q [M] float32, the token log-probabilities summed in float64; hidden [M, D] float32)
    from a scoring pass's outputs."""
    pred_rows, _, owner, final_rows = rows
    token_lp = np.asarray(out.token_lp)[:len(pred_rows)].astype(np.float64)
    log_q = np.zeros(m_count, np.float64)
    np.add.at(log_q, np.asarray(owner, np.int64), token_lp)
    hidden = np.asarray(out.hidden)[np.asarray(final_rows, np.int64)]
    return log_q.astype(np.float32), hidden.astype(np.float32)


def _padded(values: Sequence[int], size: int, fill: int = 0) -> np.ndarray:
    out = np.full(size, fill, np.int32)
    out[:len(values)] = values
    return out


class JaxLanguageModel(TokenizedBackend):
    """A frozen Flax NNX decoder that scores candidate sets and generates text, as
    :class:`agent_shell.lm.hf.HFLanguageModel` does (the same arguments, layouts and numbers).

    Args:
        decoder: a loaded :class:`agent_shell.lm.jax_model.Decoder`.
        tokenizer: its HuggingFace tokenizer.
        name: backbone identifier recorded in concept metadata.
        eos_token_ids: end-of-sequence ids of the model's generation config (the tokenizer's are
            added).
        max_context_tokens: the window; default the config's ``max_position_embeddings``.
        candidate_layout: ``"tree"`` (default), ``"packed"`` or ``"batched"``
            (:mod:`agent_shell.lm.scoring`).
        reuse_cache: keep the last context's KV cache and reuse its common prefix next call, and
            keep pinned prompt heads.
        max_heads: how many pinned heads are kept.
        draft_tokens: greedy single replies are verified in drafts of at most this many tokens
            looked up in the prompt; 0 decodes one token per pass.

    Raises:
        ValueError: unknown candidate layout, negative ``draft_tokens``, or an unknown window.
    """

    def __init__(self, decoder: Decoder, tokenizer: PreTrainedTokenizerBase, *, name: str,
                 eos_token_ids: Sequence[int] = (), max_context_tokens: int | None = None,
                 candidate_layout: str = "tree", reuse_cache: bool = True, max_heads: int = 16,
                 draft_tokens: int = DRAFT_TOKENS) -> None:
        if candidate_layout not in CANDIDATE_LAYOUTS:
            raise ValueError(f"candidate_layout={candidate_layout!r} is not one of {CANDIDATE_LAYOUTS}")
        if draft_tokens < 0:
            raise ValueError(f"draft_tokens={draft_tokens} is negative")
        self.decoder = decoder
        self.config = decoder.config
        self.hidden_size: int = decoder.config.hidden_size
        self._set_text(tokenizer, name, max_context_tokens or decoder.config.max_position_embeddings or None)
        self.candidate_layout = candidate_layout
        self.reuse_cache = reuse_cache
        self.draft_tokens = int(draft_tokens)
        self.programs = Programs.of(decoder)
        self.device: jax.Device = self.programs.device  # where the weights are
        self.dtype = jnp.dtype(decoder.dtype)
        eos = set(int(i) for i in eos_token_ids)
        value = getattr(tokenizer, "eos_token_id", None)
        eos.update([value] if isinstance(value, int) else (value or []))
        self._eos_ids = frozenset(eos)
        self.cache = PrefixCache(None, self.device, reuse_cache, HeadStore(max_heads), ops=JaxKV())

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, name: str | None = None, dtype: str = "auto",
                        device: str | None = None, **kwargs: Any) -> "JaxLanguageModel":
        """Load a HuggingFace model folder (``config.json``, safetensors weights, tokenizer files).

        Args:
            path: the folder.
            name: identifier for concept metadata; default ``str(path)``.
            dtype: ``"auto"``, ``"float32"`` or ``"bfloat16"`` (:func:`resolve_jax_dtype`).
            device: as :func:`resolve_jax_device`.
            kwargs: see the class.

        Raises:
            FileNotFoundError: no config.json, no safetensors weights or no tokenizer in ``path``.
            agent_shell.lm.jax_model.UnsupportedModel: an architecture the decoder does not implement.
            agent_shell.lm.model_config.BadModelFolder: the folder disagrees with its weights or
                holds a broken file (:func:`agent_shell.lm.model_folder.check_model_folder`).
            ValueError: an unknown dtype or device.
        """
        from transformers import AutoTokenizer

        from agent_shell.lm.model_config import generation_eos
        from agent_shell.lm.model_folder import check_model_folder

        dev = resolve_jax_device(device)
        jdtype = resolve_jax_dtype(dtype, dev)
        check_model_folder(path, "jax")  # the folder against its weights, before anything loads
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
        except OSError as err:
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise FileNotFoundError(f"cannot load a tokenizer from {str(path)!r}: {reason}") from err
        decoder = load_decoder(path, dtype=jdtype, device=dev)
        return cls(decoder, tokenizer, name=name or str(path), eos_token_ids=generation_eos(path), **kwargs)

    def fork(self) -> "JaxLanguageModel":
        """A view of the same weights and compiled programs with its own, empty prefix KV cache
        (the pinned heads are shared)."""
        twin = copy.copy(self)
        twin.cache = PrefixCache(None, self.device, self.reuse_cache, self.cache.heads, ops=JaxKV())
        return twin

    @property
    def dtype_name(self) -> str:
        """The weights' dtype as a plain name (``"float32"``, ``"bfloat16"``)."""
        return str(self.dtype)

    @property
    def program_count(self) -> int:
        """How many distinct compiled programs this backbone's passes have used so far."""
        return len(self.programs.compiled)

    # ------------------------------------------------------------------ passes
    def _forward(self, ids: Sequence[int], cache: StreamKV, start: int) -> PassOutput:
        """A causal pass over ``ids`` after the ``start`` tokens ``cache`` holds (a chunk of a
        context or prompt); the head runs at its last token."""
        n = len(ids)
        return self._run(cache, Pass(list(ids), list(range(start, start + n)), start, np.tril(np.ones((n, n), bool)),
                                     [n - 1]))

    def _run(self, cache: StreamKV, p: Pass) -> PassOutput:
        """Run pass ``p`` on ``cache`` (batch 1), padded to its buckets; ``cache`` then holds
        ``p.at`` + the pass's tokens (cut it back to keep fewer)."""
        n = len(p.tokens)
        t = bucket(n)
        kv = self.programs.writable(cache, p.at + t)
        mask = np.zeros((1, t, t), bool)
        mask[0, :n, :n] = p.allowed
        mask[0, np.arange(n, t), np.arange(n, t)] = True  # padding tokens see themselves only
        positions = _padded(p.positions, t, p.positions[-1] if p.positions else 0)
        k = n_pairs = bucket(max(len(p.head), len(p.pairs[0])))  # one size for both: fewer programs
        rows, targets = p.pairs
        column = _padded(rows, n_pairs)
        kv, hidden, greedy, token_lp, captured = self.programs.run(
            "stream", kv, _padded(p.tokens, t)[None], positions[None], np.int32(p.at), mask, _padded(p.head, k),
            column, _padded(targets, n_pairs), _padded(p.capture, bucket(len(p.capture)) if p.capture else 0),
            np.asarray(p.layers, np.int32))
        cache.kv, cache.length, cache.owned = kv, p.at + n, True
        return PassOutput(hidden, greedy, token_lp, captured)

    # ------------------------------------------------------------------ scoring
    def score(self, context: Context, candidates: Sequence[str], action_prefix: str) -> CandidateScores:
        """Score each candidate as a continuation of ``render(context, action_prefix)``
        (:meth:`agent_shell.lm.hf.HFLanguageModel.score`).

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
        :func:`cb_core.decisions.bucket_size` (M) slots: what :meth:`cb_core.Concept.decide` reads,
        so a decision is taken before anything is fetched. The same pass as :meth:`score`; the
        token log-probabilities are summed in float32 on the device (``score`` sums them in
        float64 on the host: the two agree to float32 rounding).

        Raises:
            ValueError, ContextWindowFull: as :meth:`score`.
        """
        from cb_core.decisions import bucket_size

        toks, out, (_, _, owner, final_rows), _ = self._candidates_pass(context, candidates, action_prefix, [])
        m = len(toks)
        m_pad = bucket_size(m)
        log_q, hidden = self.programs.run("gather", out.token_lp, out.hidden,
                                          _padded(owner, int(out.token_lp.shape[0]), fill=m_pad),
                                          _padded(final_rows, m_pad))
        n_tokens = np.ones(m_pad, np.int32)
        n_tokens[:m] = [t.n_action for t in toks]
        return DeviceScores(log_q, hidden, n_tokens, m)

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

    def candidate_states(self, context: Context, candidates: Sequence[str], action_prefix: str, layer: int,
                         pool: str = "last") -> np.ndarray:
        """An inner layer's states at the candidates' action tokens, float32 [M, hidden_size]
        (:meth:`agent_shell.lm.hf.HFLanguageModel.candidate_states`: 0 = the embeddings, K = the
        output of decoder layer K before the final norm, negative from the end)."""
        return self.score_with_layers(context, candidates, action_prefix, [(layer, pool)]).layers[(layer, pool)]

    def _candidates_pass(self, context: Context, candidates: Sequence[str], action_prefix: str,
                         capture: Sequence[tuple[int, str, tuple[int, str]]]
                         ) -> tuple[Sequence[TokenizedContinuation], PassOutput, Rows, Positions]:
        """The candidates' tokens (checked) and their one pass in this backend's layout: (the
        tokens, the pass's output, the head rows' roles, the captured tokens of each candidate)."""
        toks, s = self.scoring_tokens(context, candidates, action_prefix)
        one_pass = self._score_rows if self.candidate_layout == "batched" else self._score_in_one_pass
        return (toks, *one_pass(toks, s, capture))

    def _score(self, context: Context, candidates: Sequence[str], action_prefix: str,
               capture: Sequence[tuple[int, str, tuple[int, str]]]) -> CandidateScores:
        toks, out, rows, positions = self._candidates_pass(context, candidates, action_prefix, capture)
        n_tokens = np.array([t.n_action for t in toks], dtype=np.int32)
        log_q, hidden = _gather(out, rows, len(toks))
        states = {}
        if capture:
            wanted = sorted({c for _, cols in positions for c in cols})
            at = {c: i for i, c in enumerate(wanted)}
            captured = np.asarray(out.captured)
            for j, (_, pool, key) in enumerate(capture):
                rows = [captured[j, [at[c] for c in cols]] for _, cols in positions]
                states[key] = np.stack([r.mean(0) if pool == "mean" else r[-1] for r in rows]).astype(np.float32)
        return CandidateScores(log_q=log_q, n_tokens=n_tokens, hidden=hidden, layers=states)

    def _score_in_one_pass(self, toks: Sequence[TokenizedContinuation], s: int,
                           capture: Sequence[tuple[int, str, tuple[int, str]]]) -> tuple[PassOutput, Rows, Positions]:
        """The tree (or packed) pass, the context's uncached tokens leading it
        (:meth:`agent_shell.lm.hf.HFLanguageModel._score_in_one_pass`): (its output, the head
        rows' roles, the captured tokens of each candidate)."""
        ids = toks[0].ids
        cache, start = self.cache.start(ids[:s])
        lo = max(start, s - PREFILL_CHUNK)
        self.cache.encode(cache, ids, start, self._forward, stop=lo)
        self.cache.encoded_tokens += s - lo
        tree = candidate_tree(toks, s, self.candidate_layout)
        needed, rows = head_rows(toks, tree, s)
        n_head, n = s - lo, s - lo + len(tree.tokens)
        allowed = np.zeros((n, n), bool)
        allowed[:n_head, :n_head] = np.tril(np.ones((n_head, n_head), bool))
        allowed[n_head:, :n_head] = True
        allowed[n_head:, n_head:] = tree.ancestry()
        positions = action_positions(toks, s, self.candidate_layout, n_head) if capture else []
        wanted = sorted({c for _, cols in positions for c in cols})
        pred_rows, targets, _, _ = rows
        out = self._run(cache, Pass(list(ids[lo:s]) + tree.tokens, list(range(lo, s)) + [s + d for d in tree.depths],
                                    lo, allowed, [n_head + node for node in needed], (pred_rows, targets), wanted,
                                    [k for k, _, _ in capture]))
        self.cache.ops.cut(cache, s)  # the context stays, the candidates go
        if s and self.cache.reusable(cache):
            self.cache.keep(cache, ids[:s])
        return out, rows, positions

    def _score_rows(self, toks: Sequence[TokenizedContinuation], s: int,
                    capture: Sequence[tuple[int, str, tuple[int, str]]]) -> tuple[PassOutput, Rows, Positions]:
        """The batched layout: one right-padded row per candidate over the context's cache, read
        once for all rows."""
        cache = self.cache.prefill(toks[0].ids[:s], self._forward)
        segs = [t.ids[s:] for t in toks]
        width, m = bucket(max(len(g) for g in segs)), bucket(len(segs))
        ids = np.zeros((m, width), np.int32)
        for b, g in enumerate(segs):
            ids[b, :len(g)] = g
        head, (pred_rows, targets, owner, final_rows) = batched_head_rows(toks, s, width)
        positions = [(b, [b * width + c for c in cols]) for b, cols in action_positions(toks, s, "batched")]
        wanted = sorted({c for _, cols in positions for c in cols}) if capture else []
        shared = cache.kv if cache.kv is not None else self.programs.buffer(1, MIN_CAPACITY)
        k = n_pairs = bucket(max(len(head), len(pred_rows)))  # one size for both: fewer programs
        _, hidden, greedy, token_lp, captured = self.programs.run(
            "rows", self.programs.buffer(m, width), shared, np.int32(s), ids,
            np.broadcast_to(s + np.arange(width, dtype=np.int32), (m, width)).copy(), np.int32(0),
            np.tril(np.ones((1, width, width), bool)), _padded(head, k), _padded(pred_rows, n_pairs),
            _padded(targets, n_pairs), _padded(wanted, bucket(len(wanted)) if wanted else 0),
            np.asarray([k for k, _, _ in capture], np.int32))
        return PassOutput(hidden, greedy, token_lp, captured), (pred_rows, targets, owner, final_rows), positions

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
            out = self._run(cache, Pass(feed, list(range(cached, cached + m)), cached, np.tril(np.ones((m, m), bool)),
                                        list(range(m))))
            return np.asarray(out.greedy)[:m].tolist()

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
        shared = cache.kv if cache.kv is not None else self.programs.buffer(1, MIN_CAPACITY)
        state = {"rows": self.programs.buffer(n, capacity(budget, least=1))}
        key = jax.random.PRNGKey(secrets.randbits(63) if seed is None else int(seed))
        base = len(ids) - 1

        def advance(tokens: list[int], step: int) -> list[int]:
            state["rows"], drawn = self.programs.run(
                "sample", state["rows"], shared, np.int32(base), np.asarray(tokens, np.int32)[:, None],
                np.full((n, 1), base + step, np.int32), np.int32(step), key, np.int32(step),
                np.float32(temperature))
            return np.asarray(drawn).tolist()

        first = advance([ids[-1]] * n, 0)
        texts = reply_rows(first, lambda tokens, step: advance(tokens, step + 1), budget, stop, self.tokenizer,
                           self._eos_ids)
        if self.cache.reusable(cache) and len(ids) > 1:
            self.cache.keep(cache, ids[:-1])
        return texts


@contextlib.contextmanager
def host_fetches() -> Iterator[list[tuple[int, ...]]]:
    """Count the JAX arrays whose values reach the host while the context is open: a list that
    grows by the shape of each one (a diagnostic for measurements and tests, not for runs).

    Counted: every first read of an array's value (``int``, ``float``, ``.tolist()``,
    ``jax.device_get``, ...) and every ``np.asarray`` / ``np.array`` of a JAX array (on a CPU
    NumPy reads those through the buffer protocol, below any Python hook). Not thread-safe:
    it patches ``jax.Array``'s value and NumPy's two constructors for the duration.
    """
    from jax._src.array import ArrayImpl

    seen: list[tuple[int, ...]] = []
    value, asarray, array = ArrayImpl._value, np.asarray, np.array

    def read(self):
        if self._npy_value is None:
            seen.append(tuple(self.shape))
        return value.fget(self)

    def converting(make):
        def convert(obj, *args, **kwargs):
            if isinstance(obj, jax.Array):
                seen.append(tuple(obj.shape))
            return make(obj, *args, **kwargs)
        return convert

    ArrayImpl._value, np.asarray, np.array = property(read), converting(asarray), converting(array)
    try:
        yield seen
    finally:
        ArrayImpl._value, np.asarray, np.array = value, asarray, array


def load_jax_model(arg: str | None, *, dtype: str = "auto", device: str | None = None,
                   **kwargs: Any) -> JaxLanguageModel:
    """The backend of ``--model jax:ARG``: ``ARG`` a HuggingFace model folder, a hub name already in
    the HuggingFace cache, or empty (or a default alias) for the offline default backbone
    (:func:`agent_shell.lm.default_model.default_model_dir`, the same folder the PyTorch backend
    loads).

    Raises:
        agent_shell.lm.default_model.ModelNotFoundError: the model cannot be found.
        agent_shell.lm.jax_model.UnsupportedModel: an architecture the decoder does not implement.
        ValueError: an unknown dtype or device.
    """
    from agent_shell.lm.default_model import DEFAULT_MODEL_ALIASES, DEFAULT_MODEL_NAME, default_model_dir

    if not arg or arg.lower() in DEFAULT_MODEL_ALIASES:
        return JaxLanguageModel.from_pretrained(default_model_dir(), name=DEFAULT_MODEL_NAME, dtype=dtype,
                                                device=device, **kwargs)
    path = Path(arg).expanduser()
    if not path.is_dir():
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(arg, local_files_only=True))
    return JaxLanguageModel.from_pretrained(path, name=arg, dtype=dtype, device=device, **kwargs)


__all__ = ["BUCKETS", "DeviceScores", "JaxKV", "JaxLanguageModel", "Programs", "StreamKV", "bucket", "capacity",
           "host_fetches", "jax_device_name", "jax_dtype_name", "load_jax_model", "resolve_jax_device",
           "resolve_jax_dtype"]
