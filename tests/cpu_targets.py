"""Numba targets other than the host, for tests that compile the kernels' other code paths.

Code compiled for a named CPU may use every instruction LLVM's definition of that CPU
implies, whatever NUMBA_CPU_FEATURES adds: running it on a host without them dies of
SIGILL. Tests that run such code skip where `host_can_run` says no; tests that only read
the machine code compile it without running it (test_kernels_asm).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from edgeinfer.kernels.target import CPU_FEATURES

_X86 = platform.machine().lower() in ("x86_64", "amd64")
_HASWELL = {"avx", "avx2", "fma", "f16c", "bmi", "bmi2", "lzcnt", "movbe", "popcnt", "sse4.2"}
# The instructions LLVM may emit for each named CPU the tests use (X86.td's feature lists,
# less the system instructions compiled code never contains).
NAMED_CPU_FEATURES = {
    "generic": set(),
    "haswell": _HASWELL,
    "cascadelake": _HASWELL | {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl",
                               "avx512vnni", "adx", "rdseed", "clflushopt", "clwb"},
}

AVX2_FEATURES = "+avx,+avx2,+fma,+f16c,+sse4.2"
AVX2_TARGET = {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": AVX2_FEATURES}
GENERIC_TARGET = {"NUMBA_CPU_NAME": "generic"}
# AVX-512 VNNI without BITALG (Cascade Lake): the legacy 8-block step's other 5th-bit path
VNNI_NO_BITALG_TARGET = {
    "NUMBA_CPU_NAME": "cascadelake",
    "NUMBA_CPU_FEATURES": AVX2_FEATURES + ",+avx512f,+avx512bw,+avx512vl,+avx512dq,+avx512cd,"
                                          "+avx512vnni",
}


# AArch64 CPUs, cross-compiled here (never run): their NUMBA_CPU_FEATURES name what the
# kernels' paths switch on (target.DOT_PATH): dotprod on Apple M1, Neoverse N1 (Graviton2)
# and Cortex-A76 (Raspberry Pi 5), not on Cortex-A72 (Raspberry Pi 4).
ARM_TARGETS = {
    "apple-m1": {"NUMBA_CPU_NAME": "apple-m1", "NUMBA_CPU_FEATURES": "+neon,+dotprod,+fullfp16"},
    "neoverse-n1": {"NUMBA_CPU_NAME": "neoverse-n1", "NUMBA_CPU_FEATURES": "+neon,+dotprod"},
    "cortex-a76": {"NUMBA_CPU_NAME": "cortex-a76", "NUMBA_CPU_FEATURES": "+neon,+dotprod"},
    "cortex-a72": {"NUMBA_CPU_NAME": "cortex-a72", "NUMBA_CPU_FEATURES": "+neon"},
}
# Run first in a child that compiles for AArch64 on another host: every LLVM target, and
# the process triple numba's code generator reads (and target.AARCH64) set to AArch64's.
AARCH64_PRELUDE = """
import llvmlite.binding as ll
ll.initialize_all_targets()
ll.initialize_all_asmprinters()
ll.get_process_triple = lambda: "aarch64-unknown-linux-gnu"
"""


def target_features(target: dict[str, str]) -> set[str]:
    """Every feature code compiled for `target` (numba's target variables) may use."""
    extra = target.get("NUMBA_CPU_FEATURES", "").split(",")
    return NAMED_CPU_FEATURES[target["NUMBA_CPU_NAME"]] | {f[1:] for f in extra if f[:1] == "+"}


def host_features() -> set[str]:
    """The host's features, or those of the CPU that NUMBA_CPU_NAME/FEATURES emulate for the
    whole run (the suite on an AVX2-only host: NUMBA_CPU_NAME=haswell and AVX2_FEATURES)."""
    if os.environ.get("NUMBA_CPU_NAME") in NAMED_CPU_FEATURES:
        return target_features(dict(os.environ))
    return CPU_FEATURES


def host_can_run(target: dict[str, str]) -> bool:
    """Whether this host has every instruction of `target`. The x86 CPU names run on x86-64
    hosts only."""
    return _X86 and target_features(target) <= host_features()


def skip_reason(target: dict[str, str]) -> str:
    missing = sorted(target_features(target) - host_features()) if _X86 else ["an x86-64 host"]
    return f"this CPU cannot run {target['NUMBA_CPU_NAME']} code (lacks {', '.join(missing)})"


def target_env(target: dict[str, str], cache: Path) -> dict[str, str]:
    """This process's environment for a child compiling for `target` into an empty cache:
    numba's target variables replaced (not merged with an emulated host's) by the target's."""
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")}
    return {**env, **target, "NUMBA_CACHE_DIR": str(cache)}


def require(target: dict[str, str]) -> None:
    """Skips the calling test where this host cannot run code compiled for `target`."""
    if not host_can_run(target):
        pytest.skip(skip_reason(target))
