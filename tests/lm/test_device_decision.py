"""A decision taken where the scores are (``decide``, the head handed to the backend), on both backends: the same
chosen candidate and terms as cb_core's host kernel on the fetched scores, no value read back to
the host before the argmax, one array fetched after it; the JAX backend's decision is one program;
the PyTorch backend hands its scores to JAX without a copy; CUDA's attention kernels leave cuDNN's
out."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_lm_scoring import ALFWORLD_CANDIDATES, PREFIX, make_context


def random_concept(d: int, seed: int):
    import cb_core

    return cb_core.Concept(np.random.default_rng(seed).normal(0, 0.3, d + 1).astype(np.float32), 0.8, 1e-6, {})


class TorchReads:
    """Counts tensor values read on the host (``.item()``, ``int()``, ``float()``, ``bool()``,
    ``.tolist()``, ``.numpy()``) while open."""

    NAMES = ("item", "tolist", "numpy", "__int__", "__float__", "__bool__", "__index__")

    def __enter__(self):
        self.count = 0
        self.saved = {name: getattr(torch.Tensor, name) for name in self.NAMES}
        for name, method in self.saved.items():
            setattr(torch.Tensor, name, self._counted(method))
        return self

    def _counted(self, method):
        def read(tensor, *args, **kwargs):
            self.count += 1
            return method(tensor, *args, **kwargs)
        return read

    def __exit__(self, *exc):
        for name, method in self.saved.items():
            setattr(torch.Tensor, name, method)
        return False


def test_a_decision_on_either_backend_equals_the_hosts_and_fetches_one_array(fresh_any, backend, host_fetches):
    """Contexts with and without a cached prefix (a stream that grows): ``decide`` against
    ``Concept.terms`` on ``score``'s numbers from a fresh view; between the pass and the argmax no
    value reaches the host (PyTorch: no tensor read; JAX: nothing fetched), and ``decide`` fetches
    exactly one array (the packed record). The JAX backend runs one decision program (after prefill
    chunks when the context brings more than one chunk of new tokens)."""
    from agent_shell.lm.buckets import slots

    lm = fresh_any()
    for k, n_steps in enumerate((0, 2, 3, 6)):
        context = make_context(n_steps)
        concept = random_concept(lm.hidden_size, k)
        host = fresh_any().score(context, ALFWORLD_CANDIDATES, PREFIX)
        want = concept.terms(host.hidden, host.log_q, host.n_tokens)
        runs = dict(lm.programs.compiled) if backend == "jax" else None
        with host_fetches() as fetched:
            with TorchReads() as reads:
                decided = lm.decide(context, ALFWORLD_CANDIDATES, PREFIX, concept.decision_head)
        assert reads.count == 0 and len(fetched) == 1, (reads.count, fetched)
        m = len(ALFWORLD_CANDIDATES)
        # three terms over M_pad slots, the chosen index, finite: M_pad the set's slots (PyTorch) or the
        # decision pass's token bucket (JAX, at least M)
        (size,) = fetched[0]
        assert size == 3 * slots(m) + 2 if backend == "torch" else (size - 2) % 3 == 0 and (size - 2) // 3 >= m
        if backend == "jax":
            ran = {key: n - runs.get(key, 0) for key, n in lm.programs.compiled.items() if n != runs.get(key, 0)}
            # one decision program; before it, prefill chunks of the context's new tokens past one chunk
            assert [key[0] for key in ran if key[0] != "stream"] == ["decide"], ran
            assert sum(n for key, n in ran.items() if key[0] == "decide") == 1, ran
        assert decided.chosen == int(np.argmax(want.log_p))
        # the JAX stream encodes its context in other passes than the fresh view (prefill chunks of
        # 128 tokens, candidates' passes padded to a power of two): log q agrees to the backbone's
        # float32 rounding (1e-4 nats, the scoring tests' tolerance), the kernel adds none
        tol = 3e-5 if backend == "torch" else 2e-4
        for got, ref in zip((decided.log_p, decided.prior, decided.concept_term), want):
            assert got.shape == (m,)
            np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def test_a_concept_of_another_width_is_refused_on_either_backend(fresh_any):
    with pytest.raises(ValueError, match="differ from the decision head's width d = 7"):
        fresh_any().decide(make_context(1), ALFWORLD_CANDIDATES, PREFIX, random_concept(7, 0).decision_head)


def test_the_pytorch_backends_scores_reach_jax_without_a_copy(lm32):
    """``score_on_device``'s arrays are JAX arrays over the tensors' own memory (DLPack): a change
    to the tensor shows in the array."""
    import jax

    from agent_shell.lm.decision import as_jax

    scores = lm32.score_on_device(make_context(1), ALFWORLD_CANDIDATES, PREFIX)
    assert isinstance(scores.log_q, jax.Array) and isinstance(scores.hidden, jax.Array)
    from agent_shell.lm.buckets import slots

    m = len(ALFWORLD_CANDIDATES)
    assert scores.hidden.shape == (slots(m), lm32.hidden_size) and scores.count == m
    tensor = torch.zeros(8)
    array = as_jax(tensor)
    tensor[3] = 5.0
    assert float(np.asarray(array)[3]) == 5.0


def test_a_tensor_on_a_device_jax_lacks_comes_through_the_host(monkeypatch):
    import jax

    from agent_shell.lm.decision import as_jax

    def refuse(_):
        raise RuntimeError("no such device")

    monkeypatch.setattr(jax.dlpack, "from_dlpack", refuse)
    tensor = torch.arange(6, dtype=torch.float32)
    out = as_jax(tensor)
    assert isinstance(out, np.ndarray) and np.array_equal(out, tensor.numpy())


@pytest.mark.parametrize("through_host", [False, True], ids=["DLPack", "through the host"])
@pytest.mark.parametrize("case", ["strided bfloat16", "requires grad", "strided float32 that requires grad"])
def test_the_hand_off_takes_strided_bfloat16_and_tensors_that_require_grad(monkeypatch, case, through_host):
    """A plug-in's feature block or a backend's scores may be a strided view (every other column)
    in bfloat16, or a tensor that requires grad: the hand-off gives the same values in the same
    dtype, by DLPack or, where JAX lacks the tensor's device, through the host."""
    import jax
    import ml_dtypes

    from agent_shell.lm.decision import as_jax

    if through_host:
        monkeypatch.setattr(jax.dlpack, "from_dlpack", lambda _: (_ for _ in ()).throw(RuntimeError("no device")))
    base = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))
    tensor = {"strided bfloat16": lambda: base.to(torch.bfloat16)[:, ::2],
              "requires grad": lambda: base.clone().requires_grad_(True),
              "strided float32 that requires grad": lambda: base.clone().requires_grad_(True)[::2, 1:]}[case]()
    out = as_jax(tensor)
    want = tensor.detach().float().numpy()
    assert out.shape == want.shape
    assert str(out.dtype) == ("bfloat16" if tensor.dtype == torch.bfloat16 else "float32")
    assert np.array_equal(np.asarray(out).astype(np.float32), want)
    if tensor.dtype == torch.bfloat16:  # bit for bit: bfloat16 is float32's upper half
        bits = np.asarray(out).view(np.uint16) if np.asarray(out).dtype == ml_dtypes.bfloat16 else None
        assert bits is not None and np.array_equal(bits, tensor.contiguous().view(torch.int16).numpy().view(np.uint16))


def test_cudnn_attention_is_switched_off_on_cuda_devices_only(lm32, monkeypatch):
    """The choice (cuDNN's scaled-dot-product attention off) is made for a CUDA device and not for
    the CPU, and every PyTorch backend makes it for its own device when it is built."""
    from agent_shell.lm import hf

    calls: list[bool] = []
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", calls.append)
    hf.choose_attention(torch.device("cpu"))
    assert calls == []
    hf.choose_attention(torch.device("cuda", 1))
    assert calls == [False]
    seen: list[torch.device] = []
    monkeypatch.setattr(hf, "choose_attention", seen.append)
    hf.HFLanguageModel(lm32.model, lm32.tokenizer, name=lm32.name)
    assert seen == [lm32.device]
