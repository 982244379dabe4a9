"""The CPU the kernels are compiled for, read once: its features pick the code paths (VNNI,
AVX2, AArch64 dotprod or portable integer dots; hardware or software F16 conversions)."""

from __future__ import annotations

import platform

import numba
from llvmlite import binding as llvm_binding


def host_cpu_features() -> set[str]:
    """The CPU features numba compiles for: the host's, unless numba's own NUMBA_CPU_NAME /
    NUMBA_CPU_FEATURES pick another target; a named CPU without a feature list counts as
    featureless, so kernels take their portable path."""
    if numba.config.CPU_FEATURES is not None or numba.config.CPU_NAME not in (None, "host"):
        flags = (numba.config.CPU_FEATURES or "").split(",")
        return {flag[1:] for flag in flags if flag.startswith("+")}
    try:
        features = llvm_binding.get_host_cpu_features()
    except RuntimeError:  # LLVM reads no feature list on this OS: numba compiles with none
        return set()
    return {name for name, on in features.items() if on}


def host_cpu_name() -> str:
    """The CPU numba compiles for, by LLVM's name (znver4, skylake-avx512, ...)."""
    name = numba.config.CPU_NAME
    return llvm_binding.get_host_cpu_name() if name in (None, "host") else name


def target_is_aarch64() -> bool:
    """Whether numba compiles for AArch64 (its target triple: the process's)."""
    triple = llvm_binding.get_process_triple().lower()
    return triple.startswith(("aarch64", "arm64")) or \
        platform.machine().lower() in ("aarch64", "arm64")


CPU_FEATURES = host_cpu_features()
CPU_NAME = host_cpu_name()
AARCH64 = target_is_aarch64()
# Half <-> float conversions in hardware: x86 F16C, every AArch64.
F16_NATIVE = "f16c" in CPU_FEATURES or AARCH64
# 512-bit VNNI with byte/word ops: the legacy kernels' 8-block step and, to feed it, the
# grouped activation layout of actquant (both switch on this one flag).
AVX512_VNNI = {"avx512vnni", "avx512vl", "avx512bw"} <= CPU_FEATURES
# The legacy kernels' integer block dot: vpdpbusd (AVX-VNNI / AVX512-VNNI, 32 u8*s8 products
# into 8 i32 in one instruction); else vpmaddubsw + vpmaddwd (AVX2, llama.cpp's AVX2 path);
# AArch64: sdot where the dot-product extension is (dotprod); else portable IR (LLVM picks
# widening multiplies: NEON smull/sadalp, SSE).
if AARCH64:
    DOT_PATH = "dotprod" if "dotprod" in CPU_FEATURES else "generic"
elif "avxvnni" in CPU_FEATURES or {"avx512vnni", "avx512vl"} <= CPU_FEATURES:
    DOT_PATH = "vnni"
elif "avx2" in CPU_FEATURES:
    DOT_PATH = "avx2"
else:
    DOT_PATH = "generic"
# Cache level the legacy kernels' weight prefetches fill (llvm.prefetch locality: 3 =
# prefetcht0, into L1; 2 = prefetcht1, into L2), by CPU name. They ask for rows 4 tiles ahead;
# the measured reason for each entry is in docs/performance.md, Kernels. The k-quant kernels
# keep t0.
WEIGHT_PREFETCH_LOCALITY = {"znver4": 2}.get(CPU_NAME, 3)
