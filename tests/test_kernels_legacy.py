"""Legacy-type matmul kernels and activation quantizers against independent float64 references.

Reference for every kernel: gguf-py's `dequantize(raw, type)` in float64 times the
activations, either as the kernel saw them (de-quantized xq*xd, or the rounded xf: tight) or
as the exact float x (loose, bounds the error llama.cpp's activation formats add).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cpu_targets import AVX2_TARGET, GENERIC_TARGET, VNNI_NO_BITALG_TARGET, require, target_env
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

from edgeinfer.kernels import actquant, floats, legacy  # noqa: F401  (they register the kernels)
from edgeinfer.kernels.registry import QUANT_FORMATS
from edgeinfer.linear import Linear

LEGACY = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]
# every kernel: each type's own, and its output-head variant where it has one (AVX2)
KERNELS = [QUANT_FORMATS[t] for t in LEGACY] + [
    QUANT_FORMATS[t].logits for t in LEGACY if QUANT_FORMATS[t].logits]
QUANTIZED = [f for f in KERNELS if f.act.name.startswith("q8")]


def kernel_id(fmt) -> str:
    return fmt.qtype.name + ("-logits" if fmt is not QUANT_FORMATS[fmt.qtype] else "")

# (n_out, n_in): tiles, chunks (16-18 rows: 40 makes a short chunk and a last tile moved
# back), odd counts, and with AVX-512 VNNI the block loop's steps: 8-block groups with 2
# blocks (576) or 4 + 0 (384) left, or none (1536), and rows too short for a group
SHAPES = [(1, 32), (2, 32), (7, 96), (16, 576), (5, 384), (33, 1536), (40, 64)]
N_TOK = [1, 3, 17, 64]
# loose bound on ||out - W x|| / ||W x||: activation rounding only (weights are exact here)
LOOSE = {"f32": 1e-6, "f16": 2e-3, "bf16": 1e-2, "q8_0": 2e-2, "q8_0_grouped": 2e-2,
         "q8_1": 2e-2}
MIN_OFFSET = {T.Q4_1: 2, T.Q5_1: 2}  # byte offset of the f16 block minimum m


def make_weights(qtype: T, n_out: int, n_in: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(kernel-layout weights: the rows' bytes, raw GGUF data for gguf-py) from gguf's own
    quantizer."""
    w = rng.standard_normal((n_out, n_in), dtype=np.float32)
    raw = quantize(w, qtype)
    return np.ascontiguousarray(raw).view(np.uint8).reshape(n_out, -1), raw


def random_block_bytes(qtype: T, n_out: int, n_in: int, rng) -> np.ndarray:
    """Arbitrary block bytes (every nibble, high bit and int8 incl. -128) with sane f16 scales."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n_out, n_in // block, type_size), dtype=np.uint8)
    n_scales = 2 if qtype in MIN_OFFSET else 1
    scales = rng.uniform(-0.05, 0.05, (n_out, n_in // block, n_scales)).astype(np.float16)
    raw[..., : 2 * n_scales] = scales.view(np.uint8)
    return raw.reshape(n_out, -1)


def act_buffers(kernel, x: np.ndarray):
    n_tok, n_in = x.shape
    fmt = kernel.act
    xq = np.zeros((n_tok, n_in), np.int8)
    xd = np.zeros((n_tok, n_in // 32), np.float32)
    xs = np.zeros((n_tok, n_in // (fmt.sum_block or 32)), np.float32)
    xf = np.zeros((n_tok, n_in), np.float32)
    fmt.quantize(x, xq, xd, xs, xf)
    return xq, xd, xs, xf


def seen_activations(kernel, xq, xd, xf) -> np.ndarray:
    """The activations as the kernel sees them, in float64."""
    if kernel.act.name.startswith("q8"):
        n_tok, n_in = xq.shape
        blocks = actquant.natural_order(xq, kernel.act.name)
        blocks = blocks.reshape(n_tok, -1, 32).astype(np.float64)
        blocks = blocks * xd[..., None]
        return blocks.reshape(n_tok, n_in)
    return xf.astype(np.float64)


def min_term_correction(qtype: T, raw: np.ndarray, x_seen, xs) -> np.ndarray:
    """llama.cpp adds m_w * s_x with s_x = f16(d_unrounded * sum(q)) instead of m_w * d_x *
    sum(q) (ggml_vec_dot_q4_1_q8_1): swap the term so the tight check stays tight."""
    if qtype not in MIN_OFFSET:
        return 0.0
    n_out = raw.shape[0]
    type_size = GGML_QUANT_SIZES[qtype][1]
    blocks = raw.reshape(n_out, -1, type_size)
    o = MIN_OFFSET[qtype]
    m = np.ascontiguousarray(blocks[..., o : o + 2]).view(np.float16)[..., 0].astype(np.float64)
    n_tok = x_seen.shape[0]
    block_sums = x_seen.reshape(n_tok, -1, 32).sum(-1)  # (n_tok, n_blocks) = d_x * sum(q)
    return (xs.astype(np.float64) - block_sums) @ m.T


def run_kernel(kernel, w, x):
    xq, xd, xs, xf = act_buffers(kernel, x)
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    kernel.matmul(w, xq, xd, xs, xf, out)
    return out, (xq, xd, xs, xf)


def check_against_reference(kernel, w, raw, x, loose: bool = True) -> None:
    qtype = kernel.qtype
    out, (xq, xd, xs, xf) = run_kernel(kernel, w, x)
    w64 = dequantize(raw, qtype).astype(np.float64).reshape(w.shape[0], -1)
    x_seen = seen_activations(kernel, xq, xd, xf)
    tight_ref = x_seen @ w64.T + min_term_correction(qtype, raw, x_seen, xs)
    # f32 accumulation error scales with sum |w*x|, not with the (cancelling) result
    bound = 1e-5 * (np.abs(x_seen) @ np.abs(w64).T) + 1e-30
    assert np.all(np.abs(out - tight_ref) <= bound), np.max(np.abs(out - tight_ref) / bound)
    if loose:
        exact = x.astype(np.float64) @ w64.T
        rel = np.linalg.norm(out - exact) / np.linalg.norm(exact)
        assert rel < LOOSE[kernel.act.name], rel


def test_all_legacy_types_registered() -> None:
    expect = {
        T.F32: "f32",
        T.F16: "f16",
        T.BF16: "bf16",
        T.Q8_0: "q8_0",
        T.Q4_0: "q8_0",
        T.Q5_0: "q8_0",
        T.Q4_1: "q8_1",
        T.Q5_1: "q8_1",
    }
    for qtype, act in expect.items():
        assert QUANT_FORMATS[qtype].act.name == act


@pytest.mark.parametrize("n_tok", N_TOK)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("kernel", KERNELS, ids=kernel_id)
def test_matmul_vs_dequantized_reference(kernel, shape, n_tok: int) -> None:
    rng = np.random.default_rng([int(kernel.qtype), *shape, n_tok])
    w, raw = make_weights(kernel.qtype, *shape, rng)
    x = rng.standard_normal((n_tok, shape[1]), dtype=np.float32)
    check_against_reference(kernel, w, raw, x)


@pytest.mark.parametrize("kernel", QUANTIZED, ids=kernel_id)
def test_matmul_arbitrary_block_bytes(kernel) -> None:
    """Bit patterns gguf's quantizer never writes (Q8_0 -128, all-ones nibbles, ...)."""
    rng = np.random.default_rng(int(kernel.qtype))
    raw = random_block_bytes(kernel.qtype, 37, 1536, rng)
    x = rng.standard_normal((5, 1536), dtype=np.float32) * 3
    check_against_reference(kernel, raw, raw, x, loose=False)


@pytest.mark.parametrize("kernel", KERNELS, ids=kernel_id)
def test_matmul_wider_activation_buffers(kernel) -> None:
    """n_in comes from the weights: buffers sized for a wider layer (and their trailing
    columns, here garbage) are fine, as with one scratch space shared by all layers."""
    rng = np.random.default_rng(8)
    w, _ = make_weights(kernel.qtype, 6, 96, rng)
    x = rng.standard_normal((5, 96), dtype=np.float32)
    xq, xd, xs, xf = act_buffers(kernel, x)
    wide = [np.concatenate([a, np.full_like(a, 99)], axis=1) for a in (xq, xd, xs, xf)]
    out, expect = np.zeros((5, 6), np.float32), np.zeros((5, 6), np.float32)
    kernel.matmul(w, xq, xd, xs, xf, expect)
    kernel.matmul(w, *wide, out)
    np.testing.assert_array_equal(out, expect)


@pytest.mark.parametrize("kernel", KERNELS, ids=kernel_id)
def test_matmul_read_only_weights_and_outliers(kernel) -> None:
    """GGUF tensors are read-only memory maps; activations have outlier channels."""
    rng = np.random.default_rng(7)
    w, raw = make_weights(kernel.qtype, 9, 576, rng)
    w.setflags(write=False)
    x = rng.standard_normal((2, 576), dtype=np.float32)
    x[:, 5] = 300.0
    x[1, 32:64] = 0.0  # an all-zero block: d = 0
    check_against_reference(kernel, w, raw, x, loose=False)


@pytest.mark.parametrize("qtype", [T.F16, T.BF16], ids=lambda t: t.name)
def test_half_weights_reach_the_kernel_as_their_bytes(qtype: T) -> None:
    """GGUFReader gives BF16 tensors as raw uint8 rows, F16 as float16: a Linear keeps the
    rows' bytes whatever the dtype, so one kernel overload serves them all."""
    rng = np.random.default_rng(9)
    w, _ = make_weights(qtype, 5, 64, rng)
    x = rng.standard_normal((3, 64), dtype=np.float32)
    expect, _ = run_kernel(QUANT_FORMATS[qtype], w, x)
    for alt in (w, w.view(np.uint16), w.view(np.float16)):
        lin = Linear.from_tensor("w", qtype, alt, (5, 64))
        assert lin.weight.dtype == np.uint8 and np.shares_memory(lin.weight, w)
        out, _ = run_kernel(lin.fmt, lin.weight, x)
        np.testing.assert_array_equal(out, expect)


# The block dot product has three code paths, chosen by the CPU numba targets (isa.ISA.NAME);
# this machine runs one in-process, numba's own target variables select the others.
OTHER_TARGETS = {  # name: (numba's target variables, the dot path the kernels then take)
    "avx2": (AVX2_TARGET, "avx2"),
    "generic": (GENERIC_TARGET, "generic"),  # portable IR, software f16
    "vnni-no-bitalg": (VNNI_NO_BITALG_TARGET, "vnni"),
}


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(OTHER_TARGETS))
def test_other_cpu_targets(target: str, tmp_path: Path) -> None:
    target_vars, dot_path = OTHER_TARGETS[target]
    require(target_vars)
    env = target_env(target_vars, tmp_path)
    check = "from edgeinfer.kernels.isa import ISA; print(ISA.NAME)"
    path = subprocess.run(
        [sys.executable, "-c", check], check=False, env=env, capture_output=True, text=True
    )
    assert path.stdout.strip() == dot_path, path.stderr
    subset = ("(vs_dequantized and (16x576 or 5x384 or 7x96)) or arbitrary or outliers or q8 "
              "or f16 or bf16")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", subset]
    run = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


# ---- activation quantizers


def quantize_act(fmt, x):
    n_tok, n_in = x.shape
    bufs = (
        np.zeros((n_tok, n_in), np.int8),
        np.zeros((n_tok, n_in // 32), np.float32),
        np.zeros((n_tok, n_in // (fmt.sum_block or 32)), np.float32),
        np.zeros((n_tok, n_in), np.float32),
    )
    fmt.quantize(x, *bufs)
    return (actquant.natural_order(bufs[0], fmt.name), *bufs[1:])


Q8_FORMATS = [actquant.Q8_0_ACT, actquant.Q8_0_GROUPED_ACT, actquant.Q8_1_ACT]


@pytest.mark.parametrize("fmt", Q8_FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("n_in", [256, 608, 2048])
def test_q8_grouped_layout(fmt, n_in: int) -> None:
    """Whole groups of 8 blocks are stored as the 8-block step's registers: byte 64k + 4l + i
    of a group is value 4 * GROUP_DWORDS[k][l // 8] + i of its block l % 8, and grouped
    Q8_0's xs holds minus each register lane's sum (as int32; dword d of a group is in lane
    d % SUM_LANES: 16 lanes of zmm registers, or 8 of ymm, one block each); the rest of the
    row stays in natural order, except on AVX2 (actquant.PAIRS), where its blocks go in
    pairs A, B as A's values 0..15, B's 0..15, A's 16..31, B's 16..31 (an odd last block as
    it is)."""
    if not actquant.GROUPED[fmt.name]:
        pytest.skip("natural order on this CPU target")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, n_in)).astype(np.float32)
    grouped = np.zeros((2, n_in), np.int8)
    xd = np.zeros((2, n_in // 32), np.float32)
    xs = np.zeros((2, n_in // (fmt.sum_block or 32)), np.float32)
    fmt.quantize(x, grouped, xd, xs, np.zeros_like(x))
    blocks = x.reshape(2, -1, 32)
    inv = np.float32(127) / np.abs(blocks).max(-1)
    natural = np.rint(blocks * inv[..., None]).reshape(2, -1)  # llama.cpp's x86 rounding
    sums, n_lanes = xs.view(np.int32), actquant.SUM_LANES
    for g in range(n_in // 256):
        lane_sums = np.zeros(n_lanes)
        for k, lane, i in np.ndindex(4, 16, 4):
            block = 8 * g + lane % 8
            value = natural[1, 32 * block + 4 * actquant.GROUP_DWORDS[k][lane // 8] + i]
            assert grouped[1, 256 * g + 64 * k + 4 * lane + i] == value
            lane_sums[(16 * k + lane) % n_lanes] += value
        if fmt.name != "q8_1":
            np.testing.assert_array_equal(sums[1, n_lanes * g : n_lanes * (g + 1)], -lane_sums)
    tail = n_in // 256 * 256
    expect = natural[:, tail:].copy()
    if actquant.PAIRS:
        n_pairs = (n_in - tail) // 64
        halves = expect[:, : 64 * n_pairs].reshape(2, n_pairs, 2, 2, 16)  # (pair, block, half)
        expect[:, : 64 * n_pairs] = halves.transpose(0, 1, 3, 2, 4).reshape(2, -1)
    np.testing.assert_array_equal(grouped[:, tail:], expect)


@pytest.mark.parametrize("fmt", Q8_FORMATS, ids=lambda f: f.name)
def test_q8_matches_llama_x86_rounding(fmt) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 1536)) * rng.uniform(0.01, 100, (3, 1))).astype(np.float32)
    xq, xd, xs, _ = quantize_act(fmt, x)
    blocks = x.reshape(3, -1, 32)
    amax = np.abs(blocks).max(-1)
    d = amax / np.float32(127)
    q = np.rint(blocks * (np.float32(127) / amax)[..., None])  # f32 product, ties to even
    np.testing.assert_array_equal(xq, q.reshape(x.shape).astype(np.int8))
    np.testing.assert_array_equal(xd, d.astype(np.float16).astype(np.float32))
    if fmt.name == "q8_1":
        s = d * q.sum(-1).astype(np.float32)
        np.testing.assert_array_equal(xs, s.astype(np.float16).astype(np.float32))


def test_q8_0_round_trip_error_bound() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 576), dtype=np.float32) * 5
    xq, xd, _, _ = quantize_act(actquant.Q8_0_ACT, x)
    d = np.repeat(xd, 32, axis=1)
    err = np.abs(xq * d - x)
    # half a step, plus |q| <= 127 times the f16 rounding of d (2^-11 relative)
    assert np.all(err <= d * (0.5 + 127 * 2.0**-11) + 1e-7)
    assert np.abs(xq).max() <= 127


def test_q8_0_ties_to_even_and_zero_block() -> None:
    x = np.zeros((1, 64), np.float32)
    x[0, :6] = [127.0, 0.5, 1.5, 2.5, -0.5, -2.5]  # amax 127: scale 1, x*127/amax exact
    xq, xd, _, _ = quantize_act(actquant.Q8_0_ACT, x)
    assert xq[0, :6].tolist() == [127, 0, 2, 2, 0, -2]  # roundf would give 1, 3, -1, -3
    assert xd[0].tolist() == [1.0, 0.0] and not xq[0, 32:].any()


def test_f16_rounding_matches_numpy() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4096)).astype(np.float32) * 10.0 ** rng.integers(-8, 6, 4096)
    x[0, :4] = [65520.0, 1e6, -1e-9, 1.0 + 2.0**-11]  # overflow, underflow, exact tie
    _, _, _, xf = quantize_act(actquant.F16_ACT, x)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(xf, x.astype(np.float16).astype(np.float32))


def test_bf16_rounding_matches_ggml() -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 4096)).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 4096)
    x[0, :3] = [1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.0 + 2.0**-8 + 2.0**-20]  # tie, tie, above
    _, _, _, xf = quantize_act(actquant.BF16_ACT, x)
    expect = dequantize(quantize(x, T.BF16), T.BF16)
    np.testing.assert_array_equal(xf, expect)
    assert xf[0, :3].tolist() == [1.0, 1.0 + 4 * 2.0**-8, 1.0 + 2 * 2.0**-8]


def test_f32_copies() -> None:
    x = np.random.default_rng(5).standard_normal((3, 64), dtype=np.float32)
    _, _, _, xf = quantize_act(actquant.F32_ACT, x)
    np.testing.assert_array_equal(xf, x)
