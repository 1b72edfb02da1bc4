"""The JAX backbone on a device mesh (``--device cpu:0-7``): the names, the refusals before anything
loads, each device's block of each split weight, and (slow) every score, decision and reply of
tiny Llama, Qwen2 and Qwen3 models on meshes of 1, 2, 4 and 8 simulated CPU devices against one
device. The simulated devices need ``XLA_FLAGS`` before JAX starts, so those checks run in a
subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent_shell.lm.factory import device_and_dtype
from agent_shell.lm.jax_devices import jax_device_name, resolve_jax_devices
from conftest import tiny_folder

ROOT = Path(__file__).resolve().parents[2]

#: Head counts every mesh of 1, 2, 4 and 8 divides (head size 8; the MLP's 128 and the vocabulary too).
MESH_SIZES = dict(hidden_size=128, num_attention_heads=16, num_key_value_heads=8)


def run_on_devices(script: str, devices: int, timeout: int = 600) -> dict:
    """``script``'s last printed line (JSON) when run with ``devices`` simulated CPU devices."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu",
               OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_one_device_names_stay_one_device_and_a_mesh_larger_than_present_is_one_line():
    assert len(resolve_jax_devices("cpu")) == 1 and jax_device_name("cpu:0") == "cpu"
    for name, words in (("cpu:8", ["cpu:8 is one device", "cpu:0-7", "xla_force_host_platform_device_count=8"]),
                        ("cpu:0-3", ["JAX sees 1 cpu device", "device_count=4"]),
                        ("cpu:3-1", ["runs upward", "cpu:1-3"]), ("cpu:0,0", ["twice"]), ("gpu:0-1", ["no gpu device"])):
        with pytest.raises(ValueError) as err:
            resolve_jax_devices(name)
        assert "\n" not in str(err.value) and all(w in str(err.value) for w in words), str(err.value)


@pytest.mark.slow  # two model folders written, a subprocess with eight devices
def test_a_mesh_splits_each_weight_and_buffer_and_refuses_counts_it_does_not_divide(tmp_path):
    """On 8 simulated devices: the mesh names; a model whose 2 key/value heads a mesh of 4 does not
    divide is refused in one line before any weight is read (its weights file is garbage); each
    device holds 1/8 of every split weight and of the KV buffer's heads, and the whole of each norm;
    the host reads the split tensors block by block from the safetensors file."""
    good = tiny_folder(tmp_path / "good", "llama", **MESH_SIZES)
    bad = tiny_folder(tmp_path / "bad", "llama")  # 4 heads, 2 key/value heads
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    out = run_on_devices(f"""
        import json
        from agent_shell.lm.factory import device_and_dtype
        from agent_shell.lm.jax_devices import jax_device_name
        from agent_shell.lm import load_language_model
        from agent_shell.lm.jax_mesh import shards_per_device
        names = [jax_device_name(d) for d in ("cpu:0-7", "cpu:all", "cpu:1,3", "cpu:5")]
        errors = []
        for model, device in (("jax:{bad}", "cpu:0-3"), ("jax:{bad}", "cpu:0-8")):
            try:
                device_and_dtype(model, device, "float32")
            except ValueError as err:
                errors.append(str(err))
        from agent_shell.lm.jax_model import WeightFiles
        read, block = [], WeightFiles.block
        WeightFiles.block = lambda self, name, index: read.append((name, block(self, name, index).shape)) or block(
            self, name, index)
        lm = load_language_model("jax:{good}", dtype="float32", device="cpu:0-7")
        reads = sorted(set(shape for name, shape in read if name.endswith("q_proj.weight")))
        blocks, d = lm.decoder.blocks, lm.decoder
        arrays = dict(q=blocks.q.weight, k=blocks.k.weight, o=blocks.o.weight, gate=blocks.gate.weight,
                      down=blocks.down.weight, norm=blocks.input_norm.weight, embed=d.embed, head=d.lm_head)
        shards = {{k: sorted(set(shards_per_device(v[...]).values())) for k, v in arrays.items()}}
        shards["devices"] = len(shards_per_device(d.embed[...]))
        kv = lm.cache_ops().buffer(1, 128)
        shards["kv"] = sorted(set(shards_per_device(kv.keys).values()))
        from agent_shell.concepts import fit_devices
        fits = [str(d) for d in fit_devices(lm)]
        print(json.dumps(dict(names=names, errors=errors, shards=shards, reads=reads, fits=fits)))
    """, 8)
    assert out["names"] == ["cpu:0-7", "cpu:0-7", "cpu:1,3", "cpu:5"]
    heads, mesh = out["errors"]
    assert "num_key_value_heads 2" in heads and "mesh of 4" in heads and "safetensors" not in heads
    assert "JAX sees 8 cpu device(s)" in mesh
    s = out["shards"]
    assert s["devices"] == 8
    # [L, out, in] split on the output rows (heads, MLP hidden), [L, D, in] on the input columns
    assert s["q"] == [[2, 128 // 8, 128]] and s["k"] == [[2, 64 // 8, 128]] and s["gate"] == [[2, 128 // 8, 128]]
    assert s["o"] == [[2, 128, 128 // 8]] and s["down"] == [[2, 128, 128 // 8]]
    assert s["norm"] == [[2, 128]]  # replicated
    assert s["embed"] == s["head"] == [[49152 // 8, 128]]
    assert s["kv"] == [[2, 1, 1, 128, 8]]  # [L, B, Hkv / 8, S, hd]
    assert len(set(out["fits"])) == 8  # the concepts are fitted over the same eight devices
    assert out["reads"] == [[128 // 8, 128]]  # the host reads each device's block of a layer's tensor, never all of it


MESH_RUN = """
    import json
    import numpy as np
    import cb_core
    from agent_shell.lm import load_language_model
    folder, sizes = {folder!r}, {sizes!r}
    candidates = ["go to desk 1", "go to drawer 2", "open drawer 2", "take mug 1", "examine the desk"]
    contexts = ["You are in a room.", "You are in a room. You see a desk and a drawer.", "Nothing happens."]
    runs = {{}}
    for n in sizes:
        lm = load_language_model(f"jax:{{folder}}", dtype="float32", device="cpu" if n == 1 else f"cpu:0-{{n - 1}}")
        head = cb_core.Concept(np.random.default_rng(1).normal(0, 0.3, lm.hidden_size + 1).astype(np.float32),
                               0.8, 1e-6).decision_head
        out = dict(log_q=[], hidden=[], chosen=[], log_p=[])
        for context in contexts:
            s = lm.score(context, candidates, "\\n> ")
            d = lm.decide(context + " Go on.", candidates, "\\n> ", head)
            out["log_q"].append(np.asarray(s.log_q).tolist())
            out["hidden"].append(np.asarray(s.hidden).tolist())
            out["chosen"].append(int(d.chosen))
            out["log_p"].append(np.asarray(d.log_p).tolist())
        out["reply"] = lm.generate("You are in a room.", max_new_tokens=8)
        out["programs"] = sorted(map(repr, lm.programs.compiled))
        runs[n] = out
    print(json.dumps(runs))
"""


@pytest.mark.slow  # three models, four meshes, each compiling its programs
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_every_score_decision_and_reply_on_a_mesh_is_the_one_devices(kind, tmp_path):
    """Meshes of 1, 2, 4 and 8 simulated devices: log q and the hidden states within 1e-5 of one
    device (float32; the split products sum in another order), the same decisions and greedy
    reply, and the same programs compiled (one per bucket, as on one device)."""
    import numpy as np

    sizes = dict(MESH_SIZES, head_dim=24) if kind == "qwen3" else MESH_SIZES
    folder = tiny_folder(tmp_path / kind, kind, **sizes)
    runs = run_on_devices(MESH_RUN.format(folder=str(folder), sizes=[1, 2, 4, 8]), 8)
    one = runs["1"]
    for n in ("2", "4", "8"):
        np.testing.assert_allclose(runs[n]["log_q"], one["log_q"], rtol=1e-6, atol=1e-5, err_msg=f"mesh {n}")
        np.testing.assert_allclose(runs[n]["hidden"], one["hidden"], rtol=1e-5, atol=1e-5, err_msg=f"mesh {n}")
        np.testing.assert_allclose(runs[n]["log_p"], one["log_p"], rtol=1e-6, atol=2e-5, err_msg=f"mesh {n}")
        assert runs[n]["chosen"] == one["chosen"] and runs[n]["reply"] == one["reply"]
        assert runs[n]["programs"] == one["programs"]


def test_device_and_dtype_names_a_mesh_only_for_the_jax_backend():
    with pytest.raises(ValueError):
        device_and_dtype(None, "cpu:0-1", "float32")  # torch's names have no mesh


HOST_RUN = """
    import json, sys
    import numpy as np
    import cb_core
    from agent_shell.lm import load_language_model
    lm = load_language_model(f"jax:{sys.argv[1]}", dtype="float32", device="cpu:all")
    head = cb_core.Concept(np.random.default_rng(1).normal(0, 0.3, lm.hidden_size + 1).astype(np.float32), 0.8,
                           1e-6).decision_head
    candidates = ["go to desk 1", "go to drawer 2", "open drawer 2", "take mug 1"]
    s = lm.score("You are in a room.", candidates, "\\n> ")
    d = lm.decide("You are in a room. You see a desk.", candidates, "\\n> ", head)
    import jax
    print(json.dumps(dict(devices=len(lm.placement.devices), local=len(jax.local_devices()),
                          log_q=np.asarray(s.log_q).tolist(), chosen=int(d.chosen), log_p=np.asarray(d.log_p).tolist(),
                          reply=lm.generate("You are in a room.", max_new_tokens=6))))
"""


@pytest.mark.slow  # two processes joined by JAX's multi-host runtime, each compiling its programs
def test_two_hosts_of_two_devices_each_score_and_decide_as_one_device(tmp_path):
    """``CB_AGENT_JAX_HOSTS=ADDRESS:PORT/2/ID`` in two processes of two simulated CPU devices each
    (gloo between them): ``cpu:all`` is a mesh of four over both, and each process scores, decides
    and replies as one device does in this process."""
    import socket

    import numpy as np

    import cb_core
    from agent_shell.lm import load_language_model

    folder = tiny_folder(tmp_path / "llama", "llama", **MESH_SIZES)
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    hosts = []
    for pid in (0, 1):
        env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
                   OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), CB_AGENT_JAX_HOSTS=f"localhost:{port}/2/{pid}",
                   CB_AGENT_CACHE=str(tmp_path / f"cache{pid}"))
        hosts.append(subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOST_RUN), str(folder)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT))
    outs = []
    for host in hosts:
        stdout, stderr = host.communicate(timeout=600)
        assert host.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    lm = load_language_model(f"jax:{folder}", dtype="float32", device="cpu")
    head = cb_core.Concept(np.random.default_rng(1).normal(0, 0.3, lm.hidden_size + 1).astype(np.float32), 0.8,
                           1e-6).decision_head
    candidates = ["go to desk 1", "go to drawer 2", "open drawer 2", "take mug 1"]
    log_q = np.asarray(lm.score("You are in a room.", candidates, "\n> ").log_q)
    decided = lm.decide("You are in a room. You see a desk.", candidates, "\n> ", head)
    reply = lm.generate("You are in a room.", max_new_tokens=6)
    for out in outs:
        assert out["devices"] == 4 and out["local"] == 2
        np.testing.assert_allclose(out["log_q"], log_q, rtol=1e-6, atol=1e-5)
        np.testing.assert_allclose(out["log_p"], decided.log_p, rtol=1e-6, atol=2e-5)
        assert out["chosen"] == decided.chosen and out["reply"] == reply


def test_a_hosts_setting_that_names_no_coordinator_is_one_line():
    from agent_shell.lm.jax_platforms import JaxPlatformError, start_hosts

    for setting in ("localhost/2/0", "localhost:1234/2/2", "two hosts"):
        with pytest.raises(JaxPlatformError, match="CB_AGENT_JAX_HOSTS=.* is not 'auto' or ADDRESS:PORT/PROCESSES/ID"):
            start_hosts(setting)
