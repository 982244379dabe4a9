"""The kernels' machine code has the SIMD instructions they were written for: integer dot
products (vpmaddubsw + vpmaddwd on AVX2, vpdpbusd / vpdpwssd with VNNI) and packed FMAs,
not scalar loops. Numerics tests pass either way; a kernel that silently fell back to scalar
code (a changed loop LLVM no longer vectorizes) would only show in the speed.

Code compiled for another CPU is never run here: a child on the host's target runs the
kernels once and records the signatures they were compiled for; a second child, on the
target under test, compiles those signatures (`Dispatcher.compile`) without calling anything
and prints the assembly. Both use an empty Numba cache, since cached code cannot be inspected.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cpu_targets import AARCH64_PRELUDE, ARM_TARGETS, AVX2_TARGET

from edgeinfer.kernels.target import CPU_FEATURES

# Runs the kernels of four types and SwiGLU on small inputs (on the host's target), then
# prints the signatures numba compiled the functions holding their inner loops for.
RECORD = """
import base64, pickle
import numpy as np
from gguf import GGMLQuantizationType as Q
from tiny_models import random_weight
from edgeinfer.kernels import kquants, legacy, ops
from edgeinfer.linear import ActScratch, Linear, project

rng = np.random.default_rng(0)
for qtype in (Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q6_K):
    lin = Linear.from_tensor("w", qtype, random_weight(rng, (64, 512), qtype), (64, 512))
    for n_tok in (1, 8):
        x = rng.standard_normal((n_tok, 512)).astype(np.float32)
        project(x, (lin,), (np.zeros((n_tok, 64), np.float32),), ActScratch(n_tok, 512))
g = rng.standard_normal((1, 1536)).astype(np.float32)
ops.swiglu(g, g.copy(), np.zeros_like(g))
funcs = {"legacy": legacy._chunk, "kquants": kquants._rows, "swiglu": ops._swiglu_serial}
sigs = {name: list(f.signatures) for name, f in funcs.items()}
print(base64.b64encode(pickle.dumps(sigs)).decode())
"""

# Compiles the recorded signatures for the target numba's variables name; calls nothing.
COMPILE = """
import base64, json, pickle, sys
from edgeinfer.kernels import kquants, legacy, ops
funcs = {"legacy": legacy._chunk, "kquants": kquants._rows, "swiglu": ops._swiglu_serial}
sigs = pickle.loads(base64.b64decode(sys.stdin.read()))
asm = {}
for name, f in funcs.items():
    for sig in sigs[name]:
        f.compile(sig)
    asm[name] = "\\n".join(f.inspect_asm(sig) for sig in sigs[name])
print(json.dumps(asm))
"""


def _child(script: str, target: dict[str, str] | None, cache: Path, stdin: str = "") -> str:
    """Runs `script` on `target` (numba's target variables; None: this run's own)."""
    tests = Path(__file__).parent
    env = dict(os.environ)
    if target is not None:
        env = {k: v for k, v in env.items() if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")}
        env.update(target)
    env.update({"NUMBA_CACHE_DIR": str(cache),
                "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])})
    run = subprocess.run([sys.executable, "-c", script], env=env, input=stdin,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])
    return run.stdout.splitlines()[-1]


@pytest.fixture(scope="module")
def signatures(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The inspected kernels' signatures, recorded once on this run's own target."""
    return _child(RECORD, None, tmp_path_factory.mktemp("record"))


def compiled_asm(signatures: str, target: dict[str, str] | None, cache: Path,
                 prelude: str = "") -> dict[str, str]:
    """The kernels' assembly for `target`, compiled from `signatures`, never run."""
    return json.loads(_child(prelude + COMPILE, target, cache, stdin=signatures))


def count(asm: str, mnemonic: str, register: str) -> int:
    """Instructions `mnemonic` (a regex) with an operand in a `register` (ymm, zmm) register."""
    return len(re.findall(rf"\b{mnemonic}\s+[^\n]*%{register}", asm))


@pytest.mark.slow
def test_avx2_target_emits_integer_dots_and_fma(signatures: str, tmp_path: Path) -> None:
    asm = compiled_asm(signatures, AVX2_TARGET, tmp_path)
    for kernel in ("legacy", "kquants"):  # llama.cpp's AVX2 mul_sum_us8_pairs_float
        assert count(asm[kernel], "vpmaddubsw", "ymm") > 0, kernel
        assert count(asm[kernel], "vpmaddwd", "ymm") > 0, kernel
        assert count(asm[kernel], "vpdpbusd", "ymm") == 0, kernel  # no VNNI on this target
    assert count(asm["legacy"], r"vfmadd\d+ps", "ymm") > 0  # d_w * d_x * isum + acc
    assert "prefetcht0" in asm["legacy"] and "prefetcht1" not in asm["legacy"]  # into L1
    # expf's polynomial (7 FMAs per value) vectorized: its vector body, besides the scalar
    # fallback loop LLVM keeps for the tail
    assert count(asm["swiglu"], r"vfmadd\d+ps", "ymm") >= 5


@pytest.mark.slow
def test_zen4_target_prefetches_legacy_weights_into_l2(signatures: str, tmp_path: Path) -> None:
    """target.WEIGHT_PREFETCH_LOCALITY: Zen 4 streams the legacy types' weights faster
    prefetched into L2 (prefetcht1); the k-quant kernels keep L1 there too."""
    asm = compiled_asm(signatures, {**AVX2_TARGET, "NUMBA_CPU_NAME": "znver4"}, tmp_path)
    assert "prefetcht1" in asm["legacy"] and "prefetcht0" not in asm["legacy"]
    assert "prefetcht0" in asm["kquants"]


@pytest.mark.slow
@pytest.mark.skipif(not {"avx512bw", "avx512vnni"} <= CPU_FEATURES,
                    reason="this CPU has no AVX-512 VNNI")
def test_host_vnni_target_emits_vpdpbusd_on_zmm(signatures: str, tmp_path: Path) -> None:
    asm = compiled_asm(signatures, None, tmp_path)
    assert count(asm["legacy"], "vpdpbusd", "zmm") > 0  # two blocks per instruction
    # the eight-block step: four vpdpbusd per conversion to float (2.49 over these kernels,
    # with the other steps; 1.75 with the four-block step as the main loop, 1.19 with
    # two-block steps only)
    n_dots = count(asm["legacy"], "vpdpbusd", "zmm")
    n_cvts = count(asm["legacy"], "vcvtdq2ps", "zmm")
    assert n_dots > 2.3 * n_cvts, (n_dots, n_cvts)
    assert count(asm["legacy"], r"vfmadd\d+ps", "zmm") > 0
    assert count(asm["kquants"], "vpdpwssd", "zmm") > 0  # the per-16 scales, summed in one
    assert count(asm["kquants"], "vpmaddubsw", "zmm") > 0


def arm_count(asm: str, mnemonic: str, arrangement: str = "") -> int:
    """AArch64 instructions `mnemonic` (with an operand arranged `arrangement`: 4s, 16b)."""
    return len(re.findall(rf"^\s+{mnemonic}\s+[^\n]*{re.escape(arrangement)}", asm, re.M))


@pytest.mark.slow
@pytest.mark.parametrize("cpu", sorted(ARM_TARGETS))
def test_aarch64_targets_emit_dot_products(signatures: str, tmp_path: Path, cpu: str) -> None:
    """Cross-compiled for AArch64 CPUs: sdot in the legacy and k-quant kernels where the
    dot-product extension is, NEON widening multiplies (smull, smull2) where it is not; the
    float work in vector registers; no byte-by-byte loads (a scalar decode loop) anywhere in
    the products."""
    target = ARM_TARGETS[cpu]
    asm = compiled_asm(signatures, target, tmp_path, AARCH64_PRELUDE)
    legacy, kquants = asm["legacy"], asm["kquants"]
    if "dotprod" in target["NUMBA_CPU_FEATURES"]:
        for code in (legacy, kquants):
            assert arm_count(code, "sdot", ".4s") > 0
        assert arm_count(legacy, "smull") == 0
    else:
        for code in (legacy, kquants):
            assert arm_count(code, "sdot") == 0
            assert arm_count(code, "smull2?", ".8h") > 0
    assert arm_count(legacy, "fmla", ".4s") > 0  # d_w * d_x * isum + acc, 4 lanes at a time
    for code in (legacy, kquants):
        assert arm_count(code, "ldrs?b") == 0  # weights and activations in 16-byte loads
        assert "vpmadd" not in code and "%ymm" not in code  # AArch64 code, not x86's
    assert arm_count(asm["swiglu"], "fmla", ".4s") >= 5  # expf's polynomial, vectorized


# Compiles the layer loop's other kernels for the target numba's variables name, from the
# signatures the loop calls them with (native.SIGNATURES); calls nothing.
COMPILE_LOOP_KERNELS = """
import json
from numba import types
from edgeinfer.kernels import attention, flash, native, ops
funcs = {"attention_task": (attention.attention_task, "attention_task"),
         "flash_task": (flash.flash_task, "attention_task"),
         "store_kv": (attention.store_kv, "store_kv"),
         "rms_norm": (ops._rms_norm_serial, "rms_norm"),
         "add_inplace": (ops.add_inplace, "add_inplace"),
         "swiglu": (ops._swiglu_serial, "swiglu")}
asm = {}
for name, (f, kind) in funcs.items():
    sig = native.SIGNATURES[kind]
    f.compile(sig)
    asm[name] = f.inspect_asm(sig)
print(json.dumps(asm))
"""


@pytest.mark.slow
def test_aarch64_attention_and_element_wise_kernels_vectorized(tmp_path: Path) -> None:
    """Cross-compiled for the plainest AArch64 target (Cortex-A72, NEON only): attention's
    scores and values (plain and flash) in 4-lane FMAs, the F16 cache read and written by
    the hardware's vector conversions (fcvtl, fcvtn), never a library call per half; the
    norm, the residual add and SwiGLU in vector registers."""
    script = AARCH64_PRELUDE + COMPILE_LOOP_KERNELS
    asm = json.loads(_child(script, ARM_TARGETS["cortex-a72"], tmp_path))
    for name in ("attention_task", "flash_task"):
        assert arm_count(asm[name], "fmla", ".4s") >= 64, name  # q.k and p.v, 4 keys at a time
        assert arm_count(asm[name], "fcvtl2?", ".4s") >= 16, name  # F16 K, V rows to f32
    assert arm_count(asm["flash_task"], "fcvtn2?", ".4h") > 0  # its F16 value accumulator
    assert arm_count(asm["store_kv"], "fcvtn2?", ".4h") > 0  # f32 K, V to the F16 cache
    for code in asm.values():
        assert not re.search(r"\bbl\s+_*(extendhfsf2|truncsfhf2|gnu_[fh]2[hf])", code)
        assert "%ymm" not in code
    assert arm_count(asm["rms_norm"], "fmul", ".4s") > 0
    assert arm_count(asm["add_inplace"], "fadd", ".4s") > 0
    assert arm_count(asm["swiglu"], "fmla", ".4s") >= 5
