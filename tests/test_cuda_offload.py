"""A tiny model with layers offloaded to the CUDA device (numba-cuda's simulator in CI): the
CPU's logits, as the golden bounds allow, in every placement llama.cpp's -ngl gives; and the
placement itself: the flag, the fit, the lines, the CPU fallback."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from edgeinfer.api import Model
from edgeinfer.cuda import placement
from edgeinfer.errors import EdgeInferError
from tests.cuda_helpers import cuda, rel_err  # noqa: F401  (skips without numba-cuda)
from tests.tiny_models import write_tiny_model

TOKENS = [1, 5, 9, 30, 40]
SMALL = dict(n_embd=32, n_ff=64, n_head=4, n_kv=2, head_dim=8, n_layer=2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    made = {}

    def get(arch, qtype, head_dim=SMALL["head_dim"]):
        key = arch, qtype, head_dim
        if key not in made:
            path = tmp_path_factory.mktemp("cuda") / f"{arch}-{qtype.name}-{head_dim}.gguf"
            made[key] = write_tiny_model(path, arch, qtype, **{**SMALL, "head_dim": head_dim})
        return made[key]

    return get


def agree(ours, cpu):
    """The golden bounds: the same top-1 where the CPU's is clear (a top-2 margin above 0.1;
    random tiny models have near ties), logits close (Q8_1 activations vs the CPU's)."""
    top2 = np.sort(cpu, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 0.1
    assert (ours.argmax(1) == cpu.argmax(1))[clear].all()
    assert clear.sum() >= len(cpu) // 2
    assert max(rel_err(a, b) for a, b in zip(ours, cpu)) < 0.03


@pytest.mark.parametrize("arch,qtype,ngl", [
    ("llama", Q.Q8_0, "all"),  # every layer and the output head
    ("gemma3", Q.Q4_0, 1),  # the last layer only: post-norms, q/k norms, GeGLU, a window;
    # head_dim 32: attention quantizes its own output
    ("qwen2", Q.Q5_1, 2),  # both layers, the head on the CPU: biases
], ids=["llama-all", "gemma3-1", "qwen2-2"])
def test_offloaded_logits_match_the_cpu(tiny, arch, qtype, ngl):
    path = tiny(arch, qtype, 32 if arch == "gemma3" else SMALL["head_dim"])
    cpu = Model.load(path, n_ctx=32).logits(TOKENS)
    lines = []
    model = Model.load(path, n_ctx=32, gpu_layers=ngl, notes=lines.append)
    n = 3 if ngl == "all" else ngl
    assert model.transformer.gpu_layers == n
    assert f"load_tensors: offloaded {n}/3 layers to GPU" in lines
    agree(model.logits(TOKENS), cpu)


def test_decode_and_batched_slots_on_the_device(tiny):
    """Cached decode steps in two slots at once (the server's continuous batching) give the
    logits of one prefill, as on the CPU."""
    path = tiny("llama", Q.Q8_0)
    model = Model.load(path, n_ctx=32, n_slots=2, gpu_layers="all")
    full = Model.load(path, n_ctx=32).logits(TOKENS)
    tf, v = model.transformer, model.config.n_vocab
    out = np.zeros((2, v), np.float32)
    # slot 1 prefills the first 3 tokens while slot 0 gets them one by one
    tf.forward(np.array(TOKENS[:3], np.int32), np.arange(3, dtype=np.int32),
               np.ones(3, np.int32), np.array([2], np.int32), out[:1])
    for pos in range(3):
        tf.forward(np.array([TOKENS[pos]], np.int32), np.array([pos], np.int32),
                   np.zeros(1, np.int32), np.array([0], np.int32), out[1:])
    agree(out, full[[2, 2]])
    # then both slots decode token 3 in one batch
    tf.forward(np.array([TOKENS[3]] * 2, np.int32), np.array([3, 3], np.int32),
               np.array([0, 1], np.int32), np.array([0, 1], np.int32), out)
    agree(out, full[[3, 3]])
    from edgeinfer.cuda.offload import launches_per_step

    per_step = launches_per_step(tf.weights.blocks, head=True, head_dim=8)
    assert per_step == 1 + 2 * 10 + 2  # Q8_0 throughout: q/k/v and gate/up one launch each
    assert launches_per_step(tf.weights.blocks, True, 64) == 1 + 2 * 9 + 2  # fused quantize
    assert tf.device.launches == 5 * per_step  # five forwards, one logits row each


def fill_with_noise(kv, slot: int, rng) -> None:
    """Random finite float16 values in every cell of slot's blocks, host and device."""
    dev = kv.device
    for b in kv.tables[slot]:
        for host in (kv.k, kv.v):
            noise = rng.standard_normal(host[:, b].shape).astype(np.float16)
            host[:, b] = noise.view(np.uint16)
        for cache in (dev.k, dev.v):
            cache[b].copy_to_device(rng.standard_normal(cache[b].shape).astype(np.float16))


def assert_cells_equal(got, want) -> None:
    """Two `read` copies: host K and V, device K and V."""
    for a, b in zip((*got[:2], *got[2]), (*want[:2], *want[2])):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("restore", ["write", "copy_prefix"])
def test_prompt_cache_copies_device_cells(tiny, restore):
    """A saved prompt written back (write) or a prefix shared from another slot
    (copy_prefix) puts slot 0's K and V cells into slot 1, on the host and the device: slot 1
    holds noise before, so only a real copy of both passes."""
    path = tiny("llama", Q.Q8_0)
    model = Model.load(path, n_ctx=32, n_slots=2, gpu_layers=1)
    kv = model.transformer.kv_cache
    model.logits(TOKENS, slot=0)
    saved = kv.read(0, 4)
    assert kv.slot_bytes(4) == sum(a.nbytes for a in saved[:2]) + sum(
        a.nbytes for a in saved[2])
    fill_with_noise(kv, 1, np.random.default_rng(0))
    before = kv.read(1, 4)
    for a, b in zip((*before[:2], *before[2]), (*saved[:2], *saved[2])):
        assert (a != b).any()
    if restore == "write":
        kv.write(1, saved, 4)
    else:
        kv.copy_prefix(0, 1, 4)
    assert_cells_equal(kv.read(1, 4), saved)


def test_parse_gpu_layers():
    assert placement.parse_gpu_layers("12") == 12
    assert placement.parse_gpu_layers(" ALL ") == "all"
    assert placement.parse_gpu_layers("auto") == "auto"
    assert placement.parse_gpu_layers(-1) == "all"  # llama.cpp: negative means all
    assert placement.parse_gpu_layers(None) == 0
    with pytest.raises(EdgeInferError, match="expected a number, 'all' or 'auto'"):
        placement.parse_gpu_layers("many")


def test_fit_takes_the_last_layers_then_the_head():
    layers = [10, 10, 10]
    assert placement.fit(100, layers, head=5, reserve=60) == 4  # 40 left: all and the head
    assert placement.fit(100, layers, head=15, reserve=60) == 3  # the head does not fit
    assert placement.fit(100, layers, head=5, reserve=75) == 2  # 25 left: two layers
    assert placement.fit(50, layers, head=5, reserve=60) == 0


def test_auto_uses_free_memory(tiny, monkeypatch):
    path = tiny("llama", Q.Q8_0)
    roomy = placement.Device(0, "test", (9, 0), 1 << 40, 1 << 40)
    monkeypatch.setattr(placement, "cuda_devices", lambda: [roomy])
    assert Model.load(path, n_ctx=32, gpu_layers="auto").transformer.gpu_layers == 3
    tight = placement.Device(0, "test", (9, 0), placement.CUDA_RESERVE, 1 << 40)
    monkeypatch.setattr(placement, "cuda_devices", lambda: [tight])
    assert Model.load(path, n_ctx=32, gpu_layers="auto").transformer.gpu_layers == 0


def test_no_device_warns_once_and_runs_on_the_cpu(tiny, monkeypatch):
    path = tiny("llama", Q.Q8_0)
    monkeypatch.setattr(placement, "cuda_devices", lambda: "no CUDA device or driver found")
    lines = []
    model = Model.load(path, n_ctx=32, gpu_layers="all", notes=lines.append)
    assert lines == ["warning: --gpu-layers: no CUDA device or driver found; running on "
                     "the CPU"]
    assert model.transformer.device is None and model.logits(TOKENS[:2]).shape[0] == 2


def test_without_numba_cuda_the_reason_is_named(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "numba.cuda", None)  # import fails as if not installed
    assert "numba-cuda is not installed" in placement.cuda_devices()


def _cli(*args, sim: str):
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": sim}
    return subprocess.run([sys.executable, "-m", "edgeinfer.cli", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_without_a_gpu_warns_and_answers(tiny):
    """The real CUDA target on this machine: no driver, so one warning and the CPU (on a
    machine with a GPU, the offload lines instead)."""
    path = tiny("llama", Q.Q8_0)
    done = _cli("run", path, "-ngl", "all", "-n", "2", "--temp", "0", "--raw", "-p", "the",
                sim="0")
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines()
             if "gpu-layers" in line or "layers to GPU" in line]
    assert notes in (["warning: --gpu-layers: no CUDA device or driver found; running on the "
                      "CPU"], ["load_tensors: offloading 2 repeating layers to GPU",
                               "load_tensors: offloaded 3/3 layers to GPU"])
    assert done.stdout  # the answer, on stdout only


def test_cli_rejects_a_bad_gpu_layers_value(tiny):
    done = _cli("bench", tiny("llama", Q.Q8_0), "-ngl", "many", sim="1")
    assert done.returncode == 1
    assert done.stderr.strip() == ("error: --gpu-layers: expected a number, 'all' or 'auto', "
                                   "got 'many'")


def test_server_batches_offloaded_slots(tiny):
    """A real server process with every layer on the (simulated) device: two concurrent
    greedy requests share forward passes and each gets what it gets alone."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from tests.test_server_harness import ServerProcess

    srv = ServerProcess(tiny("llama", Q.Q8_0), "-np", "2", "-c", "64", "-ngl", "all")
    try:
        def complete(prompt):
            r = httpx.post(srv.url + "/completion", timeout=300, json={
                "prompt": prompt, "n_predict": 2, "temperature": 0, "cache_prompt": False})
            assert r.status_code == 200, r.text
            return r.json()["content"]

        prompts = ["the cat", "on the"]
        alone = [complete(p) for p in prompts]
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(complete, prompts))
        assert together == alone and all(alone)
        assert "load_tensors: offloaded 3/3 layers to GPU" in srv.log_text()
    finally:
        srv.stop()
