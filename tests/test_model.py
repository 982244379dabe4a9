"""The forward pass of every architecture against the independent float64 reference, and the
cache/batching invariants (cached decode == full forward, batched == single)."""

from __future__ import annotations

import numpy as np
import pytest
import reference
from gguf import GGMLQuantizationType as Q
from tiny_models import write_tiny_model

from edgeinfer.api import Model

ARCHES = ["llama", "qwen2", "qwen3", "phi3", "gemma3"]
QUANTS = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1,
          Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
TOKENS = [5, 70, 80, 90, 100, 3, 9, 11, 12, 13, 200, 201]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")


def load(model_dir, arch, qtype, **kw):
    path = model_dir / f"{arch}-{qtype.name}-{kw.get('tied', True)}.gguf"
    if not path.exists():
        write_tiny_model(path, arch, qtype, **kw)
    return path, Model.load(path, n_ctx=64, n_slots=3)


def rel_err(ours, ref):
    return np.linalg.norm(ours - ref, axis=1) / np.linalg.norm(ref, axis=1)


@pytest.mark.parametrize("arch", ARCHES)
def test_forward_matches_reference_f32(model_dir, arch):
    """F32 weights: the only differences left are the F16 KV cache and Q/P rounding."""
    path, model = load(model_dir, arch, Q.F32)
    ours = model.logits(TOKENS)
    ref = reference.forward(str(path), TOKENS)
    assert rel_err(ours, ref).max() < 5e-3
    assert (ours.argmax(1) == ref.argmax(1)).all()


@pytest.mark.parametrize("arch", ARCHES)
def test_flash_attention_forward_matches_reference(model_dir, arch):
    """-fa on: the online-softmax kernel in every architecture's forward (12 tokens: its
    F16-accumulator path), against the same float64 reference."""
    path, _ = load(model_dir, arch, Q.F32)
    model = Model.load(path, n_ctx=64, flash_attn=True)
    assert model.transformer.flash_attn
    ours = model.logits(TOKENS)
    ref = reference.forward(str(path), TOKENS)
    assert rel_err(ours, ref).max() < 5e-3
    assert (ours.argmax(1) == ref.argmax(1)).all()


@pytest.mark.parametrize("qtype", QUANTS, ids=lambda q: q.name)
def test_forward_every_quant_type(model_dir, qtype):
    """Quantized weights, 8-bit activations: close to the exact maths, as llama.cpp is."""
    path, model = load(model_dir, "llama", qtype, tied=False)
    ours = model.logits(TOKENS)
    ref = reference.forward(str(path), TOKENS)
    assert rel_err(ours, ref).max() < 0.1
    assert (ours.argmax(1) == ref.argmax(1)).mean() >= 0.6


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_cached_decode_equals_full_forward(model_dir, arch):
    """A 4-token prefill then one token at a time gives the full forward's logits."""
    _, model = load(model_dir, arch, Q.Q8_0)
    full = model.logits(TOKENS)
    tf = model.transformer
    n = len(TOKENS)
    steps = np.zeros((n, model.config.n_vocab), np.float32)
    ids = np.array(TOKENS, np.int32)
    rows = np.arange(4, dtype=np.int32)
    tf.forward(ids[:4], rows, np.ones(4, np.int32), rows, steps[:4])
    for p in range(4, n):
        one = np.array([p], np.int32)
        tf.forward(ids[p : p + 1], one, np.ones(1, np.int32), np.zeros(1, np.int32),
                   steps[p : p + 1])
    np.testing.assert_allclose(steps, full, rtol=1e-4, atol=1e-4)


def test_batched_slots_equal_single(model_dir):
    """Three sequences at different positions in one forward == each one alone."""
    _, model = load(model_dir, "gemma3", Q.Q4_K)
    seqs = [TOKENS[:5], TOKENS[3:10], TOKENS[1:3]]
    alone = [model.logits(s, slot=i)[-1] for i, s in enumerate(seqs)]
    tf = model.transformer
    for i, s in enumerate(seqs):  # prefill all but the last token of each
        r = np.arange(len(s) - 1, dtype=np.int32)
        tf.forward(np.array(s[:-1], np.int32), r, np.full(len(r), i, np.int32), r[:0],
                   np.zeros((0, model.config.n_vocab), np.float32))
    tokens = np.array([s[-1] for s in seqs], np.int32)
    positions = np.array([len(s) - 1 for s in seqs], np.int32)
    out = np.zeros((3, model.config.n_vocab), np.float32)
    tf.forward(tokens, positions, np.arange(3, dtype=np.int32), np.arange(3, dtype=np.int32),
               out)
    np.testing.assert_allclose(out, np.stack(alone), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q4_K], ids=lambda q: q.name)
def test_every_batch_size_equals_single_bit_for_bit(model_dir, qtype):
    """1..8 sequences at different positions in one decode step: each one's logits are the
    same bits as its step alone. Counts between the kernels' token tiles (3, 5-7) run their
    products on padded rows (layers.product_rows), whose stale contents must not leak: the
    buffers are filled with NaN first."""
    path = model_dir / f"gemma3-{qtype.name}-batch.gguf"
    write_tiny_model(path, "gemma3", qtype, tied=False)
    model = Model.load(path, n_ctx=64, n_slots=8)
    tf, n_vocab = model.transformer, model.config.n_vocab
    seqs = [TOKENS[: 2 + s] for s in range(8)]  # slot s: a prompt of 2 + s tokens
    for s, seq in enumerate(seqs):
        r = np.arange(len(seq) - 1, dtype=np.int32)
        tf.forward(np.array(seq[:-1], np.int32), r, np.full(len(r), s, np.int32), r[:0],
                   np.zeros((0, n_vocab), np.float32))
    last = np.array([seq[-1] for seq in seqs], np.int32)
    pos = np.array([len(seq) - 1 for seq in seqs], np.int32)
    alone = np.zeros((8, n_vocab), np.float32)
    for s in range(8):
        one = np.arange(s, s + 1, dtype=np.int32)
        tf.forward(last[one], pos[one], one, np.zeros(1, np.int32), alone[s : s + 1])
    for b in range(1, 9):
        for buf in (tf.buffers.h, tf.buffers.attn, tf.buffers.act, tf.padded_logits):
            buf.fill(np.nan)
        out = np.zeros((b, n_vocab), np.float32)
        ids = np.arange(b, dtype=np.int32)
        tf.forward(last[:b], pos[:b], ids, ids, out)
        np.testing.assert_array_equal(out, alone[:b], err_msg=f"{b} sequences")


def test_sliding_window_masks_old_keys(model_dir):
    """gemma3 local layers (window 4) must ignore keys further back: changing token 0 changes
    nothing at position 9 only if every layer is local, so instead compare with the reference,
    which applies the window independently."""
    path, model = load(model_dir, "gemma3", Q.F32)
    ours = model.logits(TOKENS)
    ref = reference.forward(str(path), TOKENS)
    no_window = reference.forward_without_window(str(path), TOKENS)
    assert rel_err(ours, ref).max() < 5e-3
    assert rel_err(no_window, ref).max() > 1e-2  # the window matters in this model


def test_missing_tensor_names_it_and_the_layout(model_dir, tmp_path):
    """A qwen3 file without its q/k norms is not silently run as something else."""
    from edgeinfer.errors import EdgeInferError

    path = write_tiny_model(tmp_path / "q3.gguf", "qwen3", Q.Q8_0)
    data = path.read_bytes().replace(b"blk.0.attn_q_norm", b"blk.0.attn_x_norm")
    (tmp_path / "broken.gguf").write_bytes(data)
    with pytest.raises(EdgeInferError, match=r"missing tensor 'blk\.0\.attn_q_norm\.weight'.*"
                                             r"qwen3 model has.*attn_q_norm"):
        Model.load(tmp_path / "broken.gguf", n_ctx=32)


def test_a_q_norm_without_its_k_norm_is_refused(tmp_path):
    """Optional per-head norms come in pairs (the layer loop norms both or neither): a llama
    file with q norms but no k norms gets a clear error, not a read past an empty array."""
    from edgeinfer.errors import EdgeInferError

    path = write_tiny_model(tmp_path / "q3.gguf", "qwen3", Q.Q8_0)
    data = path.read_bytes().replace(b"qwen3", b"llama").replace(b"attn_k_norm",
                                                                   b"attn_x_norm")
    (tmp_path / "broken.gguf").write_bytes(data)
    with pytest.raises(EdgeInferError, match="attn_q_norm without attn_k_norm"):
        Model.load(tmp_path / "broken.gguf", n_ctx=32)


def test_mistral_sliding_window_key_is_ignored_like_llama_cpp(model_dir, tmp_path):
    """llama.cpp does not read llama.attention.sliding_window (docs/architecture.md): a
    Mistral-style file attends to the whole context, as the reference does."""
    path = write_tiny_model(tmp_path / "mistral.gguf", "llama", Q.F32, window=4,
                            llama_sliding_window=True)
    model = Model.load(path, n_ctx=64)
    ref = reference.forward(str(path), TOKENS)
    assert model.config.sliding_window == 0
    assert rel_err(model.logits(TOKENS), ref).max() < 5e-3


@pytest.mark.parametrize("enabled", [True, False])
def test_load_restores_the_collector_state(model_dir, enabled):
    """Model.load pauses the garbage collector while it builds (speed) and must leave it as
    the caller had it."""
    import gc

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        load(model_dir, "llama", Q.F32)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_kv_cache_is_zeroed_writable_and_private(model_dir):
    import os

    from edgeinfer.linear import lazy_zeros

    a = lazy_zeros((3, 2, 1000, 4, 64), np.uint16)
    assert a.shape == (3, 2, 1000, 4, 64) and a.flags.writeable and a.flags.c_contiguous
    assert not a.any()
    a[2, 1, 999] = 7
    assert a.sum() == 7 * 4 * 64
    assert lazy_zeros((0, 4), np.uint16).shape == (0, 4)
    _, model = load(model_dir, "llama", Q.F32)
    assert model.transformer.kv_cache.k.base is not None  # the cache uses these buffers
    if hasattr(os, "fork"):  # a forked child's writes must not reach the parent's cache
        pid = os.fork()
        if pid == 0:
            a[0, 0, 0, 0, 0] = 1
            os._exit(0)
        os.waitpid(pid, 0)
        assert a[0, 0, 0, 0, 0] == 0


def test_kv_cache_without_huge_page_support(monkeypatch):
    """A kernel built without transparent huge pages rejects the advice: not an error."""
    import mmap

    from edgeinfer.linear import lazy_zeros

    monkeypatch.setattr(mmap, "MADV_NOHUGEPAGE", 9999, raising=False)  # EINVAL everywhere
    assert not lazy_zeros((4, 1024), np.uint16).any()


def test_failed_load_restores_the_collector(tmp_path):
    import gc

    from edgeinfer.errors import EdgeInferError

    assert gc.isenabled()
    with pytest.raises(EdgeInferError):
        Model.load(tmp_path / "missing.gguf")
    assert gc.isenabled()


def test_compiles_are_named_as_they_happen_and_summed_up():
    """A cache miss is reported with the kernel's name, then one summary; a kernel already
    compiled says nothing (the warm-start case)."""
    import numba

    from edgeinfer.process import COMPILING, distinct_stages, reporting_compiles

    @numba.njit
    def fresh_kernel(x):
        return x + 1

    messages = []
    with reporting_compiles(messages.append):
        fresh_kernel(1)
    assert messages[0] == f"{COMPILING}: test_model.fresh_kernel"
    assert messages[-1].startswith("compiled 1 kernel in ")
    messages.clear()
    with reporting_compiles(messages.append):
        fresh_kernel(2)
    assert messages == []
    lines = []
    report = distinct_stages(lines.append)
    for m in (f"{COMPILING}: a.x", f"{COMPILING}: b.y", "compiled 2 kernels in 1.0 s"):
        report(m)
    assert lines == [f"{COMPILING}: a.x", "compiled 2 kernels in 1.0 s"]


def test_every_kernel_releases_the_gil():
    """The server's HTTP thread runs while the engine computes only if kernels release the
    GIL (with it held, each of its wake-ups waited up to Python's 5 ms switch interval)."""
    import importlib

    from numba.core.registry import CPUDispatcher

    names = ["actquant", "attention", "floats", "kquants", "legacy", "ops"]
    kernels = [obj for name in names
               for obj in vars(importlib.import_module(f"edgeinfer.kernels.{name}")).values()
               if isinstance(obj, CPUDispatcher)]
    assert len(kernels) > 30
    holding = [k.py_func.__name__ for k in kernels if not k.targetoptions.get("nogil")]
    assert holding == []


@pytest.mark.parametrize("arch", ["llama", "gemma3"])  # SwiGLU; GeGLU and post-norms
def test_element_wise_kernels_get_outputs_apart_from_inputs(model_dir, arch, monkeypatch):
    """The layer loop never hands an element-wise kernel an output that overlaps its input:
    LLVM vectorizes those loops behind a run-time overlap check, and an aliased output sends
    them down the scalar path (SwiGLU of 8 rows 6x slower), with the same results, so no
    numerics test would notice. The loop runs here as Python (its py_func, and its helpers'),
    with the element-wise kernels wrapped to check their arguments."""
    from numba.core.registry import CPUDispatcher

    import edgeinfer.model as model_module
    from edgeinfer import layers
    from edgeinfer.kernels import native

    calls = []

    def checked(kernel, name):
        def run(*args):
            *inputs, out = args
            arrays = [a for a in inputs if isinstance(a, np.ndarray) and a.ndim == 2]
            calls.append((name, any(np.shares_memory(a, out) for a in arrays)))
            return kernel(*args)
        return run

    _, model = load(model_dir, arch, Q.Q8_0)  # its kernels' addresses are in native._KERNELS
    for name, obj in list(vars(layers).items()):
        if isinstance(obj, CPUDispatcher) and obj.py_func.__module__ == layers.__name__:
            monkeypatch.setattr(layers, name, obj.py_func)
    monkeypatch.setattr(model_module, "run_layers", layers.run_layers)
    monkeypatch.setattr(layers, "call", native.call_from_python)
    monkeypatch.setattr(layers, "weight_rows", native.weight_rows_from_python)
    kernels = dict(native._KERNELS)
    for addr, kernel in kernels.items():
        name = kernel.py_func.__name__.split("_serial")[0].split("_parallel")[0].lstrip("_")
        if name in ("rms_norm", "swiglu", "geglu"):
            kernels[addr] = checked(kernel, name)
        elif name == "add_inplace":  # x += y
            kernels[addr] = lambda x, y, add=kernel: (
                calls.append(("add_inplace", np.shares_memory(x, y))), add(x, y))
    monkeypatch.setattr(native, "_KERNELS", kernels)
    model.logits(TOKENS[:5])
    names = {name for name, _ in calls}
    assert {"rms_norm", "add_inplace"} <= names and names & {"swiglu", "geglu"}
    assert not [name for name, aliased in calls if aliased]


def test_warm_up_only_when_asked_or_when_the_cache_was_cold(model_dir, monkeypatch):
    """`run` loads with warm_up=None: with every kernel already in Numba's cache, its own
    prefill loads them, so the warm-up forwards (a 32-token prefill and a step) are skipped."""
    path, _ = load(model_dir, "llama", Q.Q8_0)  # kernels compiled and cached by now
    calls = []
    monkeypatch.setattr(Model, "_warm_up", lambda self: calls.append(True))
    Model.load(path, n_ctx=64, warm_up=None)
    assert calls == []
    Model.load(path, n_ctx=64)
    assert calls == [True]
