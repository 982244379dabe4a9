"""Instructions in the kernels' hot loop per 256 weights, AArch64 against x86, from the
machine code (speed cannot be measured under emulation), and the decode speed it implies.

    python scripts/asm_table.py [--json out.json]

The kernels run once here (on this host's target) for every quant type at 1 and 8 tokens,
recording the specializations numba compiled (a type and a token count each); a child per
target compiles those for AVX2 (haswell), AArch64 with dotprod (cortex-a76) and without
(cortex-a72), cross-compiled on this host, never run. In each specialization's code the hot
loop is the innermost loop holding the most integer products; its instructions are counted
and divided by the weights it covers (its products, by the product instructions' widths:
vpmaddubsw 32, sdot 16, smull into 8 halves 8, divided by the tokens).

The estimate for one token: a decode step reads every weight once, so it takes the longer of
the weights' bytes over the memory bandwidth and the hot loops' instructions over the cores'
issue rate. Published figures: Raspberry Pi 5 (4 Cortex-A76 at 2.4 GHz, LPDDR4X-4267 on a
32-bit bus: 17 GB/s peak), Apple M2 (4 performance cores at 3.5 GHz, LPDDR5-6400 on 128
bits: 100 GB/s peak); instructions per cycle and the bandwidth reached are assumptions,
stated in the output.
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

from cpu_targets import AARCH64_PRELUDE, ARM_TARGETS, AVX2_TARGET  # noqa: E402

TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
RECORD = """
import base64, pickle
import numpy as np
from gguf import GGMLQuantizationType as Q
from tiny_models import random_weight
from edgeinfer.kernels import kquants, legacy
from edgeinfer.linear import ActScratch, Linear, project

rng = np.random.default_rng(0)
for name in %r:
    qtype = Q[name]
    lin = Linear.from_tensor("w", qtype, random_weight(rng, (64, 512), qtype), (64, 512))
    for n_tok in (1, 8):
        x = rng.standard_normal((n_tok, 512)).astype(np.float32)
        project(x, (lin,), (np.zeros((n_tok, 64), np.float32),), ActScratch(n_tok, 512))
funcs = {"legacy": legacy._chunk_tokens, "kquants": kquants._rows_tokens}
print(base64.b64encode(pickle.dumps({k: list(f.signatures) for k, f in funcs.items()})).decode())
""" % (TYPES,)
COMPILE = """
import base64, json, pickle, sys
from edgeinfer.kernels import kquants, legacy
funcs = {"legacy": legacy._chunk_tokens, "kquants": kquants._rows_tokens}
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
BRANCH = re.compile(r"^\s+(j[a-z]+|b(?:\.[a-z]+)?|cbn?z|tbn?z)\s+(?:[^\n]*,\s*)?(\.LBB\w+)\s*$")
LABEL = re.compile(r"^(\.LBB\w+):")


def child(script: str, target: dict | None, prelude: str = "", stdin: str = "") -> str:
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")}
    env.update(target or {})
    env.update({"NUMBA_CACHE_DIR": tempfile.mkdtemp(),
                "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])})
    run = subprocess.run([sys.executable, "-c", prelude + script], env=env, input=stdin,
                         capture_output=True, text=True, timeout=1800)
    if run.returncode:
        raise SystemExit(run.stderr[-3000:])
    return run.stdout.splitlines()[-1]


def hot_loop(asm: str, path: str) -> tuple[int, int]:
    """(instructions, products) of the innermost loop with the most products."""
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
    best = (0, 0)
    for a, b in inner:
        body = "\n".join(lines[a : b + 1])
        products = sum(n * len(re.findall(p, body)) for p, n in PRODUCTS[path])
        instrs = sum(1 for line in lines[a + 1 : b + 1]
                     if line.startswith(("\t", " ")) and not line.strip().startswith("."))
        if products > best[1]:
            best = (instrs, products)
    return best


def literal(text: str) -> int:
    return int(re.search(r"\((-?\d+)\)", text).group(1))


def main() -> None:
    from gguf import GGMLQuantizationType as Q

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    sigs = child(RECORD, None)
    table: dict[str, dict] = {}
    for path, (target, prelude) in TARGETS.items():
        for kind, sig, asm in json.loads(child(COMPILE, target, prelude, sigs)):
            code = literal(sig[0]) & 0xFF
            toks = literal(sig[2]) if kind == "legacy" else literal(sig[1])
            instrs, products = hot_loop(asm, path)
            if not products:
                continue
            weights = products / toks
            row = table.setdefault(f"{Q(code).name} x{toks}", {})
            row[path] = round(256 * instrs / weights, 1)
            print(f"{Q(code).name} {toks} tokens {path}: {instrs} instructions, "
                  f"{weights:g} weights", file=sys.stderr)
    print("| type, tokens | AVX2 | AArch64 dotprod | AArch64 NEON |")
    print("|---|---|---|---|")
    for key in sorted(table, key=lambda k: (TYPES.index(k.split()[0]), k)):
        row = table[key]
        print(f"| {key} | {row.get('avx2', '-')} | {row.get('dotprod', '-')} | "
              f"{row.get('neon', '-')} |")
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
