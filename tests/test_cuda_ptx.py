"""Every CUDA kernel compiled to PTX for sm_80 and sm_90 by numba-cuda's real target (NVVM),
with no GPU: what the simulator accepts but the GPU target rejects fails here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.cuda_helpers import cuda  # noqa: F401  (skips without numba-cuda)

QUANTIZED = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k")


@pytest.mark.parametrize("cc", ["80", "90"])
def test_every_kernel_compiles_to_ptx(cc):
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    done = subprocess.run([sys.executable, "-m", "edgeinfer.cuda.ptx", cc], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    kernels = json.loads(done.stdout)[f"sm_{cc}"]
    assert len(kernels) == 18  # 13 matmuls (one per weight type) and 5 layer kernels
    assert all(k["target"] == f"sm_{cc}" and k["bytes"] > 1000 for k in kernels.values())
    for name in QUANTIZED:  # integer dots through the inline-PTX dp4a
        assert kernels[f"matmul_{name}"]["dp4a"], name
    for name in ("matmul_f16", "add_norm_quant", "rope_store", "attention"):
        assert kernels[name]["shfl"], name  # the GPU reduces with warp shuffles
