"""vLLM backend of :class:`agent_shell.lm.protocol.LanguageModel` for GPU serving (``--model vllm:PATH``).

UNVERIFIED: written without a GPU (vLLM needs one); its agreement with the HuggingFace backend
has not been measured. Run the check before trusting numbers from it:
``python benchmarks/vllm_agreement.py --model PATH`` (or ``python -m pytest -m gpu``). Written
against vLLM's API of the range :data:`agent_shell.lm.versions.TESTED` names.

The same three numbers per candidate as :mod:`agent_shell.lm.hf` (seed App. B), from two vLLM
engines over the same weights:

* ``log_q`` and ``n_tokens``: the *generation* engine's prompt log-probabilities
  (``SamplingParams(prompt_logprobs=0)`` gives the log-probability of each prompt token given
  the tokens before it) summed over the candidate's action tokens; the tokenization and the
  context/action boundary are :mod:`agent_shell.lm.tokenization`'s, exactly as in the HF backend;
* ``hidden``: the *pooling* engine (``runner="pooling"``) with LAST pooling and no activation
  (``PoolerConfig(pooling_type="LAST", use_activation=False)``: for an embedding pooler the
  activation is the L2 normalisation), i.e. the final-norm output at the candidate's final token,
  the LM head's input.

Expected cost: vLLM does not read its prefix cache for a request that asks for prompt
log-probabilities (cached blocks carry no logits), so the generation engine encodes the whole
context again for every candidate: a step with M candidates after a C-token context costs about
M (C + L) prefill tokens, against the HF backend's new context tokens plus the candidates' token
tree. The pooling engine does read the prefix cache (the context once per step). vLLM batches the
M requests itself, so the GPU stays busy, but the HF prefix-tree scorer
(:mod:`agent_shell.lm.scoring`) is the GPU default. The two engines split the GPU memory
(``gpu_memory_utilization`` each, default 0.3), leaving room for the concept fit in JAX
(``docs/gpu.md``).

Imports vllm only inside :func:`load_vllm_model`; must not import the agents or the environments.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from agent_shell.lm.formatting import PLAIN, Formatter
from agent_shell.lm.protocol import CandidateScores, Context, ContextWindowFull, check_candidates
from agent_shell.lm.tokenization import Tokenization

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from vllm import LLM
    from vllm.config import PoolerConfig

#: Marked in metadata and names until the agreement check has passed on a GPU.
VERIFIED = False
INSTALL_HINT = ("the vllm backend needs vLLM and a CUDA GPU: pip install 'cb-agent[vllm]' "
                "(see docs/gpu.md); this backend is unverified")


class VLLMLanguageModel:
    """A frozen LM served by vLLM (a :class:`~agent_shell.lm.protocol.LanguageModel`): prompt
    log-probabilities for log Q, LAST pooling for the hidden state. vLLM returns both to the host,
    so a decision is the host decision on them (:func:`agent_shell.lm.decision.decide`).

    Args:
        generator: a ``vllm.LLM`` (generation runner, prefix caching on).
        pooler: a ``vllm.LLM`` over the same weights with ``runner="pooling"``, LAST pooling,
            no activation (:func:`last_pooling`).
        tokenizer: the model's HuggingFace tokenizer (the generator's).
        name: backbone identifier (concept metadata).
        hidden_size: d.
        max_context_tokens: the window (the engine's ``max_model_len``).
        dtype: the engines' dtype name.
    """

    def __init__(self, generator: LLM, pooler: LLM, tokenizer: PreTrainedTokenizerBase, *, name: str, hidden_size: int,
                 max_context_tokens: int, dtype: str):
        self.generator = generator
        self.pooler = pooler
        self.tokenizer = tokenizer
        self.name = name
        self.hidden_size = int(hidden_size)
        self.max_context_tokens = int(max_context_tokens)
        self.dtype = dtype
        self.formatter = Formatter(tokenizer, name)
        self.tokens = Tokenization(tokenizer)

    @property
    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "formatting": PLAIN, "hidden_size": self.hidden_size,
                "hidden": "vLLM LAST pooling, not normalised (final-norm output at the final action token)",
                "dtype": self.dtype, "backend": "vllm", "verified": VERIFIED}

    def fork(self) -> "VLLMLanguageModel":
        """vLLM's automatic prefix cache serves every stream: the backend is its own view."""
        return self

    def pin_prefix(self, head: Context) -> int:
        """Run ``head`` through the generation engine once so its blocks are in the prefix cache,
        for :meth:`generate` (scoring requests ask for prompt log-probabilities and do not read
        that cache; vLLM may evict the blocks under memory pressure: nothing is pinned for good)."""
        from vllm import SamplingParams

        ids = self.tokens.encode(*self.formatter.rendered(head))
        self.generator.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1), use_tqdm=False)
        return len(ids)

    def score(self, context: Context, candidates: Sequence[str], action_prefix: str) -> CandidateScores:
        """As :meth:`agent_shell.lm.hf.HFLanguageModel.score` (same token accounting and errors)."""
        from vllm import SamplingParams

        actions = check_candidates(candidates)
        base, markers = self.formatter.rendered(context, action_prefix)
        toks = self.tokens.continuations(base, actions, markers)
        for a, t in zip(actions, toks):
            if len(t.ids) > self.max_context_tokens:
                raise ContextWindowFull(f"context is too long: candidate {a!r} needs {len(t.ids)} tokens, more than the "
                                 f"window of {self.max_context_tokens} tokens of {self.name!r}")
            if t.first < 1:
                raise ValueError("nothing to condition on: the rendered context and prefix are empty")
        prompts = [{"prompt_token_ids": list(t.ids)} for t in toks]
        outs = self.generator.generate(prompts, SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
        log_q = np.empty(len(toks), np.float64)
        for m, (t, out) in enumerate(zip(toks, outs)):
            # prompt_logprobs[j]: {token id: Logprob} for prompt token j given tokens < j (None at j = 0)
            log_q[m] = sum(out.prompt_logprobs[j][t.ids[j]].logprob for j in range(t.first, len(t.ids)))
        pooled = self.pooler.embed(prompts, use_tqdm=False)
        hidden = np.asarray([p.outputs.embedding for p in pooled], np.float32)
        n_tokens = np.array([t.n_action for t in toks], np.int32)
        return CandidateScores(log_q=log_q.astype(np.float32), n_tokens=n_tokens, hidden=hidden)

    def generate(self, prompt: Context, max_new_tokens: int = 64, stop: Sequence[str] = (), temperature: float = 0.0,
                 n: int = 1, seed: int | None = None) -> list[str]:
        """As :meth:`agent_shell.lm.hf.HFLanguageModel.generate`; sampling uses vLLM's per-request
        seed, so sampled replies differ from the HF backend's for the same seed."""
        from vllm import SamplingParams

        from agent_shell.lm.decoding import check_generation

        stop = check_generation(max_new_tokens, stop, temperature, n)
        ids = self.tokens.encode(*self.formatter.rendered(prompt))
        if not ids:
            raise ValueError("empty prompt: nothing to continue (the tokenizer adds no BOS)")
        budget = min(max_new_tokens, self.max_context_tokens - len(ids))
        if budget <= 0:
            if max_new_tokens > 0:
                raise ContextWindowFull(f"prompt is too long: {len(ids)} tokens leave no room in the window of "
                                 f"{self.max_context_tokens} tokens of {self.name!r}")
            return [""] * n
        rows = n if temperature > 0 else 1
        params = SamplingParams(n=rows, max_tokens=budget, temperature=temperature, seed=seed, stop=list(stop) or None)
        (out,) = self.generator.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        texts = [c.text for c in out.outputs]
        return texts if rows == n else texts * n


def load_vllm_model(path: str | os.PathLike | None, dtype: str = "auto", device: str | None = None, *,
                    gpu_memory_utilization: float = 0.3, max_model_len: int | None = None,
                    **kwargs: Any) -> VLLMLanguageModel:
    """Two vLLM engines (generation + LAST pooling) over the model at ``path`` (``None``/``default``:
    the offline SmolLM2 folder).

    Raises:
        ModuleNotFoundError: vLLM is not installed (the message says how to install it).
        agent_shell.lm.versions.UntestedVersion: vLLM outside its tested range (one line).
        ValueError: a device other than CUDA.
    """
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        raise ModuleNotFoundError(INSTALL_HINT) from err
    from agent_shell.lm.versions import check_versions

    check_versions(("vllm",))
    if device not in (None, "cuda") and not str(device).startswith("cuda"):
        raise ValueError(f"the vllm backend runs on a CUDA GPU, not on device={device!r}")
    from transformers import AutoConfig
    from vllm import LLM

    from agent_shell.lm.default_model import DEFAULT_MODEL_ALIASES, DEFAULT_MODEL_NAME, default_model_dir
    from agent_shell.lm.dtypes import dtype_name

    if path is None or str(path).lower() in DEFAULT_MODEL_ALIASES:
        folder, name = str(default_model_dir()), DEFAULT_MODEL_NAME
    else:
        folder, name = str(path), str(path)
    dtype_str = dtype_name(dtype, "cuda")
    common = dict(model=folder, dtype=dtype_str, gpu_memory_utilization=gpu_memory_utilization,
                  max_model_len=max_model_len, enable_prefix_caching=True, **kwargs)
    generator = LLM(**common)
    pooler = LLM(**common, runner="pooling", convert="embed", pooler_config=last_pooling())
    config = AutoConfig.from_pretrained(folder)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = generator.llm_engine.model_config.max_model_len
    return VLLMLanguageModel(generator, pooler, generator.get_tokenizer(), name=f"{name} [vllm, unverified]",
                             hidden_size=config.hidden_size, max_context_tokens=window, dtype=dtype_str)


def last_pooling() -> PoolerConfig:
    """LAST pooling without activation: the raw final-norm state at the last token.

    vLLM names the switch ``use_activation`` (for an embedding pooler, the L2 normalisation);
    releases before it named it ``normalize``, which current ones refuse."""
    import inspect

    from vllm.config import PoolerConfig

    switch = "use_activation" if "use_activation" in inspect.signature(PoolerConfig).parameters else "normalize"
    return PoolerConfig(pooling_type="LAST", **{switch: False})


__all__ = ["INSTALL_HINT", "VERIFIED", "VLLMLanguageModel", "last_pooling", "load_vllm_model"]
