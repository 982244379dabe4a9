"""The paged KV cache's memory manager (issue 38), pure Python, for the kernels and server.

  pool.py      BlockPool: fixed-size blocks shared by all sequences, refcounts, the free
               list, LRU eviction of cached leaves; PoolFull
  radix.py     RadixCache: a prefix tree of full blocks (token ids -> block), Match
  sequence.py  BlockTable: one sequence's blocks (reserve, adopt a match with copy-on-write
               of a partial block, commit to the cache, release, the kernels' table row);
               admit: admission control in blocks

Not thread-safe: like the model, it belongs to the one engine thread.
"""

from edgeinfer.kv.pool import ROOT, BlockPool, PoolFull, block_nbytes
from edgeinfer.kv.radix import Match, RadixCache
from edgeinfer.kv.sequence import UNUSED, Admission, BlockTable, RowCopy, Verdict, admit

__all__ = ["ROOT", "UNUSED", "Admission", "BlockPool", "BlockTable", "Match", "PoolFull",
           "RadixCache", "RowCopy", "Verdict", "admit", "block_nbytes"]
