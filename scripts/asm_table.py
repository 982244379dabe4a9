"""Instructions in the kernels' hot loop per 256 weights, AArch64 against x86, from the
machine code (speed cannot be measured under emulation), and the decode speed it implies.

    python scripts/asm_table.py [--model M.gguf ...] [--json out.json]

The kernels run once here (on this host's target) for every quant type at 1 and 8 tokens,
recording the specializations numba compiled (a type and a token count each); a child per
target compiles those for AVX2 (haswell), AArch64 with dotprod (cortex-a76) and without
(cortex-a72), cross-compiled on this host, never run. In each specialization's code the hot
loop is the innermost loop holding the most integer products (packed FMAs for F32, F16,
BF16); its instructions are counted and divided by the weights it covers (its products, by
the product instructions' widths: vpmaddubsw 32, sdot 16, smull into 8 halves 8, an FMA 8 or
4, divided by the tokens).

The estimate for one token: a decode step reads every weight once, so it takes the longer of
the weights' bytes over the memory bandwidth and the hot loops' instructions over the cores'
issue rate. Published figures: Raspberry Pi 5 (4 Cortex-A76 at 2.4 GHz, LPDDR4X-4267 on a
32-bit bus: 17 GB/s peak), Apple M2 (4 performance cores at 3.5 GHz, LPDDR5-6400 on 128
bits: 100 GB/s peak), Raspberry Pi 4 (the NEON path); instructions per cycle and the
bandwidth reached are assumptions, stated in MACHINES and the output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from cpu_targets import AARCH64_PRELUDE, ARM_TARGETS, AVX2_TARGET, target_env  # noqa: E402

TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
         "Q5_K", "Q6_K")
RECORD = """
import base64, pickle
import numpy as np
from gguf import GGMLQuantizationType as Q
from tiny_models import random_weight
from edgeinfer.kernels import floats, kquants, legacy
from edgeinfer.linear import ActScratch, Linear, project

rng = np.random.default_rng(0)
for name in %r:
    qtype = Q[name]
    lin = Linear.from_tensor("w", qtype, random_weight(rng, (64, 512), qtype), (64, 512))
    for n_tok in (1, 8):
        x = rng.standard_normal((n_tok, 512)).astype(np.float32)
        project(x, (lin,), (np.zeros((n_tok, 64), np.float32),), ActScratch(n_tok, 512))
funcs = {"legacy": legacy._chunk_tokens, "kquants": kquants._rows_tokens,
         "floats": floats.matmul_float}
print(base64.b64encode(pickle.dumps({k: list(f.signatures) for k, f in funcs.items()})).decode())
""" % (TYPES,)
COMPILE = """
import base64, json, pickle, sys
from edgeinfer.kernels import floats, kquants, legacy
funcs = {"legacy": legacy._chunk_tokens, "kquants": kquants._rows_tokens,
         "floats": floats.matmul_float}
sigs = pickle.loads(base64.b64decode(sys.stdin.read()))
out = []
for name, f in funcs.items():
    for sig in sigs[name]:
        f.compile(sig)
        out.append([name, [str(t) for t in sig], f.inspect_asm(sig)])
print(json.dumps(out))
"""
TARGETS = {
    "avx2": (AVX2_TARGET, ""),
    "dotprod": (ARM_TARGETS["cortex-a76"], AARCH64_PRELUDE),
    "neon": (ARM_TARGETS["cortex-a72"], AARCH64_PRELUDE),
}
# product instructions and the products each makes
PRODUCTS = {
    "avx2": [(r"vpmaddubsw\s+[^\n]*%ymm", 32)],
    "dotprod": [(r"sdot\s+v\d+\.4s", 16)],
    "neon": [(r"smull2?\s+v\d+\.8h", 8)],
}
FLOAT_PRODUCTS = {  # the float kernel's: packed FMAs
    "avx2": [(r"vfmadd\w+\s+[^\n]*%ymm", 8)],
    "dotprod": [(r"fmla\s+v\d+\.4s", 4)],
    "neon": [(r"fmla\s+v\d+\.4s", 4)],
}
BRANCH = re.compile(r"^\s+(j[a-z]+|b(?:\.[a-z]+)?|cbn?z|tbn?z)\s+(?:[^\n]*,\s*)?(\.LBB\w+)\s*$")
LABEL = re.compile(r"^(\.LBB\w+):")


def child(script: str, target: dict | None, prelude: str = "", stdin: str = "") -> str:
    env = target_env(target or {}, Path(tempfile.mkdtemp()))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), str(ROOT)])
    run = subprocess.run([sys.executable, "-c", prelude + script], env=env, input=stdin,
                         capture_output=True, text=True, timeout=1800)
    if run.returncode:
        raise SystemExit(run.stderr[-3000:])
    return run.stdout.splitlines()[-1]


def hot_loops(asm: str, products_of: list) -> list[tuple[int, int]]:
    """(instructions, products) of the innermost loops with the most products, in code
    order."""
    lines = [line for line in asm.splitlines() if line.strip()]
    labels = {}
    loops = []
    for i, line in enumerate(lines):
        if m := LABEL.match(line):
            labels[m.group(1)] = i
        elif (m := BRANCH.match(line)) and m.group(2) in labels:
            loops.append((labels[m.group(2)], i))  # a backward branch: a loop
    inner = [(a, b) for a, b in loops
             if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops)]
    found = []
    for a, b in inner:
        body = "\n".join(lines[a : b + 1])
        products = sum(n * len(re.findall(p, body)) for p, n in products_of)
        instrs = sum(1 for line in lines[a + 1 : b + 1]
                     if line.startswith(("\t", " ")) and not line.strip().startswith("."))
        found.append((instrs, products))
    most = max((p for _, p in found), default=0)
    return [f for f in found if f[1] == most and most]


FLOAT_DTYPES = {"float32": "F32", "int16": "F16", "uint16": "BF16"}


def per_256(kind: str, sig: list[str], asm: str, path: str) -> dict[str, float]:
    """{"TYPE xN": instructions per 256 weights for N tokens} of one compiled kernel."""
    loops = hot_loops(asm, (FLOAT_PRODUCTS if kind == "floats" else PRODUCTS)[path])
    if not loops:
        return {}
    if kind == "floats":  # one kernel for every token count: its two loops in source order,
        # 4 tokens per converted weight (prefill), then 4 rows of one token
        name = FLOAT_DTYPES[re.match(r"[a-z]+\((\w+)", sig[0]).group(1)]
        (quad, quad_products), (one, one_products) = loops[0], loops[-1]
        return {f"{name} x1": 256 * one / one_products,
                f"{name} x8": 2 * 256 * quad / (quad_products / 4)}
    from gguf import GGMLQuantizationType as Q

    code = literal(sig[0]) & 0xFF
    toks = literal(sig[2]) if kind == "legacy" else literal(sig[1])
    instrs, products = loops[0]
    return {f"{Q(code).name} x{toks}": 256 * instrs / (products / toks)}


# name: (path, cores, GHz, peak GB/s, instructions per cycle assumed). Published: Raspberry
# Pi 5 4x Cortex-A76 2.4 GHz, LPDDR4X-4267 x 32 bits; Apple M2 4 performance cores 3.5 GHz,
# LPDDR5-6400 x 128 bits; Raspberry Pi 4 4x Cortex-A72 1.8 GHz, LPDDR4-3200 x 32 bits. IPC:
# about the 128-bit SIMD pipes each core has (A76 two, M2 four; A72 3-wide, its two SIMD
# pipes 64 bits wide for many operations)
MACHINES = {
    "Raspberry Pi 5": ("dotprod", 4, 2.4, 17.1, 2.0),
    "Apple M2": ("dotprod", 4, 3.5, 102.4, 4.0),
    "Raspberry Pi 4": ("neon", 4, 1.8, 12.8, 1.0),
}
STREAM_OF_PEAK = 0.6  # a streaming read reaches this share of the bus's peak (assumed)
KERNEL_OF_STREAM = 0.9  # our products reach this share of a streaming read (measured on x86)


def model_weights(path: Path) -> tuple[str, list[tuple[str, int, int]]]:
    """(name, [(type, weights, bytes)]) of the matrices one decode token reads: every 2-D
    tensor but the embedding table, which a tied head (no output.weight) reads as well."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    names = {t.name for t in reader.tensors}
    out = []
    for t in reader.tensors:
        if len(t.shape) != 2 or min(t.shape) < 2:
            continue
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue
        out.append((t.tensor_type.name, int(t.n_elements), int(t.n_bytes)))
    return path.stem, out


def estimates(models: list[Path], table: dict[str, dict]) -> list[dict]:
    """Decode tokens/s per model and machine: the longer of the weights' bytes over the
    bandwidth reached and the hot loops' instructions over the cores' issue rate."""
    rows = []
    for path in models:
        name, weights = model_weights(path)
        n_bytes = sum(b for _, _, b in weights)
        for machine, (isa, cores, ghz, peak, ipc) in MACHINES.items():
            instrs = sum(n * table[f"{t} x1"][isa] / 256 for t, n, _ in weights)
            t_mem = n_bytes / (peak * 1e9 * STREAM_OF_PEAK * KERNEL_OF_STREAM)
            t_cpu = instrs / (cores * ghz * 1e9 * ipc)
            rows.append({"model": name, "machine": machine, "path": isa,
                         "weight_mb": round(n_bytes / 1e6, 1),
                         "instructions_m": round(instrs / 1e6, 1),
                         "memory_ms": round(1e3 * t_mem, 2), "compute_ms": round(1e3 * t_cpu, 2),
                         "tokens_per_s": round(1 / max(t_mem, t_cpu))})
    return rows


def literal(text: str) -> int:
    return int(re.search(r"\((-?\d+)\)", text).group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--model", type=Path, action="append", default=[],
                   help="a GGUF whose decode speed to estimate (repeatable)")
    args = p.parse_args()
    sigs = child(RECORD, None)
    table: dict[str, dict] = {}
    for path, (target, prelude) in TARGETS.items():
        for kind, sig, asm in json.loads(child(COMPILE, target, prelude, sigs)):
            for key, n in per_256(kind, sig, asm, path).items():
                table.setdefault(key, {})[path] = round(n, 1)
    print("| type, tokens | AVX2 | AArch64 dotprod | AArch64 NEON |")
    print("|---|---|---|---|")
    for key in sorted(table, key=lambda k: (TYPES.index(k.split()[0]), k)):
        row = table[key]
        print(f"| {key} | {row.get('avx2', '-')} | {row.get('dotprod', '-')} | "
              f"{row.get('neon', '-')} |")
    rows = estimates(args.model, table)
    if rows:
        print(f"\nDecode estimate (streaming read {STREAM_OF_PEAK:.0%} of peak, products "
              f"{KERNEL_OF_STREAM:.0%} of it; instructions per cycle as MACHINES):")
        print("| model | machine | path | weights MB | instructions M | memory ms | "
              "compute ms | tokens/s |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            print("| " + " | ".join(str(v) for v in r.values()) + " |")
    if args.json:
        args.json.write_text(json.dumps({"per_256_weights": table, "decode": rows}, indent=1))


if __name__ == "__main__":
    main()
