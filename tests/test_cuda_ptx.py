"""Every CUDA kernel compiled to PTX for sm_80 and sm_90 by numba-cuda's real target (NVVM),
with no GPU, then assembled by ptxas for that target: what the simulator accepts but the GPU
target rejects fails here, and so does a bad inline-PTX string."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cuda_helpers import cuda  # noqa: F401  (skips without numba-cuda)

QUANTIZED = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k")


def find_ptxas() -> str | None:
    """NVIDIA's nvcc wheel's ptxas first (nvidia-cuda-nvcc-cu12, which numba-cuda[cu12] in the
    dev extra installs): the same CUDA release as the NVVM that writes the PTX, so it accepts
    its PTX ISA version (8.8 from 12.9), which an older toolkit's ptxas would reject; else the
    one on PATH or in /usr/local/cuda*/bin (CUDA 13's also takes 8.8 and sm_80/sm_90)."""
    try:
        import nvidia.cuda_nvcc as wheel

        for root in wheel.__path__:
            if os.access(path := os.path.join(root, "bin", "ptxas"), os.X_OK):
                return path
    except ImportError:
        pass
    return shutil.which("ptxas") or next(iter(sorted(glob.glob("/usr/local/cuda*/bin/ptxas"))),
                                         None)


@pytest.fixture(scope="module", params=["80", "90"])
def compiled(request, tmp_path_factory) -> tuple[str, dict, Path]:
    """(cc, the JSON summary per kernel, the folder of NAME.ptx) for one compute capability."""
    cc, out = request.param, tmp_path_factory.mktemp(f"ptx{request.param}")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    done = subprocess.run([sys.executable, "-m", "edgeinfer.cuda.ptx", cc, "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return cc, json.loads(done.stdout)[f"sm_{cc}"], out / f"sm_{cc}"


@pytest.fixture(scope="module")
def ptxas() -> str:
    path = find_ptxas()
    if path is None:
        pytest.skip("ptxas not found (pip install nvidia-cuda-nvcc-cu12, or a CUDA toolkit)")
    return path


def assemble(ptxas: str, cc: str, ptx: Path) -> subprocess.CompletedProcess:
    return subprocess.run([ptxas, f"-arch=sm_{cc}", "-o", os.devnull, str(ptx)],
                          capture_output=True, text=True, timeout=300)


def test_every_kernel_compiles_to_ptx(compiled):
    cc, kernels, _ = compiled
    assert len(kernels) == 18  # 13 matmuls (one per weight type) and 5 layer kernels
    assert all(k["target"] == f"sm_{cc}" and k["bytes"] > 1000 for k in kernels.values())
    for name in QUANTIZED:  # integer dots through the inline-PTX dp4a
        assert kernels[f"matmul_{name}"]["dp4a"], name
    for name in ("matmul_f16", "add_norm_quant", "rope_store", "attention"):
        assert kernels[name]["shfl"], name  # the GPU reduces with warp shuffles


def test_ptxas_assembles_every_kernel(compiled, ptxas):
    cc, kernels, folder = compiled
    failed = {}
    for name in kernels:
        done = assemble(ptxas, cc, folder / f"{name}.ptx")
        if done.returncode != 0:
            failed[name] = done.stderr[-1500:]
    assert not failed, f"ptxas {ptxas} -arch=sm_{cc}: {failed}"


def test_ptxas_rejects_a_bad_inline_ptx_string(compiled, ptxas, tmp_path):
    cc, _, folder = compiled
    bad = tmp_path / "bad.ptx"  # dp4a's second operand type misspelt, as a typo would
    bad.write_text((folder / "matmul_q4_0.ptx").read_text().replace("dp4a.s32.s32",
                                                                    "dp4a.s32.s64"))
    done = assemble(ptxas, cc, bad)
    assert done.returncode != 0 and "dp4a" in done.stderr
