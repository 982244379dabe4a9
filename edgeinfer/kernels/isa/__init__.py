"""The ISA-specific steps of the integer kernels, one module per instruction set, chosen
once here by target.DOT_PATH:

| module     | integer products                                   | legacy block loop         |
|------------|----------------------------------------------------|---------------------------|
| vnni.py    | vpdpbusd / vpdpwssd (AVX-VNNI, AVX512-VNNI)        | 8, 4, 2 blocks per step   |
| avx2.py    | vpmaddubsw + vpmaddwd, the sign trick              | 8, 2, then 1              |
| dotprod.py | sdot (AArch64 dot-product extension), x86's lanes   | 1                         |
| generic.py | portable widening multiplies (LLVM picks: NEON...) | 1                         |

Each module exports the same names (generic.py has them all, with their contracts):
u8s8_pairs, i16_pairs, i16_pairs_add, i8_dot, scaled_dot for the products; BLOCKS_PER_STEP,
BIASED_WEIGHTS, STEPS_ADD_MINS, ONE_TAIL_STEP, HEAD_KERNELS, block_dot, bias_correction,
step_scales, tile_rows and wide_steps for legacy.py's tile; superblock_sums_zmm for
kquants.py. `ISA` is the chosen module. A new ISA is one more module and one line below (and
its DOT_PATH in target.py)."""

from __future__ import annotations

from importlib import import_module

from edgeinfer.kernels.target import DOT_PATH

MODULES = {"vnni": "vnni", "avx2": "avx2", "dotprod": "dotprod",
           "generic": "generic"}  # DOT_PATH -> module

ISA = import_module(f"edgeinfer.kernels.isa.{MODULES[DOT_PATH]}")
