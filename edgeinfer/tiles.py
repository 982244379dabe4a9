"""The row tiles of the matrix kernels (no Numba here: speculative decoding sizes its
drafts with them, and the CLI imports that without compiling anything).

The kernels take tokens in register tiles of 8 and 4 (and 2 or 1 by type); a count between
them runs as the tile above it, when the buffers have the rows, since two overlapping smaller
tiles decode every weight block twice (docs/performance.md, "Padded tiles"). Every token's
outputs are the same bits in any tile.
"""

PAD_TO = (1, 2, 4, 4, 8, 8, 8, 8)  # product rows for 1..8 tokens
TILE = 8  # the largest tile: more rows go as tiles of 8 and the rest


def fills_tiles(n: int) -> bool:
    """Whether n rows cost no padded row: 1, 2, 4, 8, then multiples of 8."""
    return n >= 1 and (PAD_TO[n - 1] == n if n <= TILE else n % TILE == 0)
