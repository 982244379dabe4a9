"""scripts/asm_table.py's reading of machine code: which loop is the hot one, and its
instructions per 256 weights (the figures docs/performance.md's AArch64 table reports)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
asm_table = pytest.importorskip("asm_table")

# Two nested loops and an inner one after them: the inner loop with the most sdot is the
# hot one (.LBB0_3, 6 instructions, 2 sdot = 32 products), not the outer loop around it
# nor the loop with one sdot.
ASM = """
\t.text
_kernel:
\tmov\tx8, xzr
.LBB0_2:
\tmovi\tv0.2d, #0000000000000000
.LBB0_3:
\tldr\tq1, [x0], #16
\tldr\tq2, [x1], #16
\tsdot\tv0.4s, v1.16b, v2.16b
\tsdot\tv3.4s, v1.16b, v2.16b
\tsubs\tx9, x9, #1
\tb.ne\t.LBB0_3
\tadd\tx8, x8, #1
\tcmp\tx8, x10
\tb.ne\t.LBB0_2
.LBB0_5:
\tsdot\tv0.4s, v1.16b, v2.16b
\tsubs\tx9, x9, #1
\tb.ne\t.LBB0_5
\tret
"""


def test_hot_loop_is_the_inner_loop_with_the_most_products():
    assert asm_table.hot_loops(ASM, asm_table.PRODUCTS["dotprod"]) == [(6, 32)]


def test_instructions_per_256_weights_for_the_tokens_served():
    sig = ["Literal[int](2)", "x", "Literal[int](8)"]  # Q4_0 (code 2), 8 tokens
    # 32 products over 8 tokens: 4 weights a pass, 6 instructions -> 384 per 256 weights
    assert asm_table.per_256("legacy", sig, ASM, "dotprod") == {"Q4_0 x8": 384.0}
    one = ["Literal[int](2)", "x", "Literal[int](1)"]
    assert asm_table.per_256("legacy", one, ASM, "dotprod") == {"Q4_0 x1": 48.0}
