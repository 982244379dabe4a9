"""The CPU's peak rates of the instructions the matrix kernels are made of, one core: how
many 8-bit integer dot-product and f32 FMA instructions it retires per cycle. Batched decode
(8 sequences, scripts/bench_batch.py) and prefill are bound by these, not by memory, so the
ratio of 8 sequences to one depends on the CPU as much as on the kernels.

    python scripts/bench_dot_peak.py --json peak.json

Each rate is a loop of independent instructions in inline assembly (their registers zeroed
each iteration by zero idioms, which cost no execution), timed and divided by the clock
measured the same way from a chain of dependent vector integer adds (one cycle each). x86 with
AVX2 only; VNNI rates where the CPU has it. A benchmark: the machine's noise shows in it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import llvmlite.binding as llvm
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from edgeinfer.kernels.target import CPU_FEATURES

ITERATIONS = 2_000_000
llvm.initialize_native_asmparser()  # numba's JIT assembles no inline assembly without it


def _zero(regs) -> str:
    return "".join(f"vpxor %ymm{r}, %ymm{r}, %ymm{r}\n\t" for r in regs)


def _ops(mnemonic: str, count: int, dests=range(3, 16)) -> str:
    """count `mnemonic %ymm1, %ymm2, %ymmD`, D cycling over dests: independent where the
    instruction does not read D (an FMA does: give it a register of its own each)."""
    dests = list(dests)
    return "".join(f"{mnemonic} %ymm1, %ymm2, %ymm{dests[k % len(dests)]}\n\t"
                   for k in range(count))


def _loop(body: str, clobbers: list[str]):
    """A jitted f(n) running the inline assembly `body` n times."""

    @intrinsic
    def run(typingctx, n):
        def codegen(context, builder, signature, args):
            constraint = ",".join(f"~{{{c}}}" for c in clobbers)
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), body, constraint,
                               side_effect=True)
            with cgutils.for_range(builder, args[0]):
                builder.call(asm, [])
            return context.get_dummy_value()

        return types.none(types.int64), codegen

    @njit(nogil=True)
    def loop(n):
        run(n)

    return loop


_YMM = [f"ymm{r}" for r in range(16)]
_ADDS = 32  # dependent adds per iteration of the clock loop
CLOCK = "clock (dependent adds)"


def kernels() -> dict[str, tuple[str, int, list[str], tuple | None]]:
    """name -> (assembly, instructions per iteration counted by the rate, clobbers, the
    multiply-adds one counted instruction (or pair) does and their type, if named)."""
    zero = _zero(range(16))
    out = {
        CLOCK: ("vpaddd %ymm0, %ymm1, %ymm1\n\t" * _ADDS, _ADDS, _YMM, None),
        "vpmaddubsw": (zero + _ops("vpmaddubsw", 16), 16, _YMM, None),
        "vpmaddwd": (zero + _ops("vpmaddwd", 16), 16, _YMM, None),
        # llama.cpp's AVX2 8-bit dot: 32 multiply-adds per vpmaddubsw + vpmaddwd pair
        "vpmaddubsw + vpmaddwd pairs": (
            zero + _ops("vpmaddubsw", 8, range(3, 9)) + _ops("vpmaddwd", 8, range(9, 16)),
            8, _YMM, (32, "int8")),
        "vfmadd231ps": (zero + _ops("vfmadd231ps", 12), 12, _YMM, (8, "f32")),
        "vpmaddubsw beside 7/8 as many FMAs": (
            zero + _ops("vpmaddubsw", 8, range(3, 9)) + _ops("vfmadd231ps", 7, range(9, 16)),
            8, _YMM, None),
    }
    if "avxvnni" in CPU_FEATURES or {"avx512vnni", "avx512vl"} <= CPU_FEATURES:
        out["vpdpbusd (ymm)"] = (zero + _ops("vpdpbusd", 16), 16, _YMM, (32, "int8"))
    return out


def measure(rounds: int) -> dict[str, float]:
    """Median ns per counted instruction of each kernel."""
    loops = {name: (_loop(body, clobbers), count)
             for name, (body, count, clobbers, _) in kernels().items()}
    for fn, _ in loops.values():
        fn(1000)  # compile
    samples: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(rounds):  # alternate: noise hits every kernel alike
        for name, (fn, count) in loops.items():
            t0 = time.perf_counter()
            fn(ITERATIONS)
            samples[name].append((time.perf_counter() - t0) / (ITERATIONS * count) * 1e9)
    return {name: statistics.median(s) for name, s in samples.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    if "avx2" not in CPU_FEATURES:
        raise SystemExit("bench_dot_peak: needs an x86 CPU with AVX2")
    ns = measure(args.rounds)
    ghz = 1.0 / ns.pop(CLOCK)
    print(f"clock {ghz:.2f} GHz (a chain of dependent vpaddd, one cycle each)")
    rows = []
    work = {name: k[3] for name, k in kernels().items()}
    for name, t in ns.items():
        per_cycle = 1.0 / (t * ghz)
        note = ""
        if work[name]:
            n, kind = work[name]
            note = f"  = {n * per_cycle:.1f} {kind} multiply-adds per cycle"
        print(f"{name:32s} {per_cycle:5.2f} per cycle{note}")
        rows.append({"kernel": name, "per_cycle": round(per_cycle, 3), "ns": round(t, 4)})
    if args.json:
        report = {"ghz": round(ghz, 3), "rounds": args.rounds, "results": rows}
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
