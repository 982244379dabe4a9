"""The GGUF reader's memory: what it leaves resident after parsing a header."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from gguf import GGUFWriter

from edgeinfer.gguf_file import GGUFFile


def _mapping_rss_kb(path) -> int:
    """Resident kB of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
                inside = len(fields) >= 6 and fields[5] == str(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_header_pages_are_not_left_resident(tmp_path):
    """A 262k-token vocabulary is megabytes of header, read once into Python objects: the
    reader gives its pages back, so they do not count in the process's RSS."""
    path = tmp_path / "big_vocab.gguf"
    w = GGUFWriter(str(path), "llama")
    tokens = [f"token_{i:06d}_" + "x" * 16 for i in range(200_000)]  # ~6 MB of header
    w.add_token_list(tokens)
    w.add_token_scores([float(i) for i in range(len(tokens))])
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    g = GGUFFile(path)
    assert g.metadata["tokenizer.ggml.tokens"][-1] == tokens[-1]
    assert g.data_offset > 5_000_000
    assert _mapping_rss_kb(path) < 1024  # the header alone would be > 5000 kB
    assert np.array_equal(g.tensor("output_norm.weight"), np.ones(64, np.float32))
