"""Compile every CUDA kernel to PTX for a compute capability, with no GPU and no driver:
numba-cuda's real typing and code generation (NVVM), so code that the simulator runs but
the GPU target rejects fails here. `python -m edgeinfer.cuda.ptx 80 90 [--out DIR]` prints a
JSON summary per kernel and writes DIR/sm_80/NAME.ptx for ptxas (CI: tests/test_cuda_ptx.py;
run with NUMBA_ENABLE_CUDASIM=0)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace


def kernel_signatures() -> dict[str, tuple]:
    """Each kernel the offloaded layers launch, by name, with its argument types."""
    from numba import types as t
    from numba.np.numpy_support import from_dtype

    from edgeinfer.cuda.kernels import attention, matmul, norms
    from edgeinfer.cuda.kernels.registry import CUDA_FORMATS

    def arr(dtype, ndim):
        return t.Array(dtype, ndim, "A")

    f32_1, f32_2, f32_3 = arr(t.float32, 1), arr(t.float32, 2), arr(t.float32, 3)
    i32_1, i32_2 = arr(t.int32, 1), arr(t.int32, 2)
    f16_4 = arr(t.float16, 4)
    act = (i32_2, f32_2, f32_2)  # xq, xd, xs
    found = {}
    for qtype, fmt in CUDA_FORMATS.items():
        w = arr(from_dtype(fmt.dtype), 2)
        found[f"matmul_{qtype.name.lower()}"] = (
            matmul.make_matmul(fmt.dot32),
            (w, *act, f32_2, f32_1, f32_2, t.int64, t.int64))
    found["quantize_q8_1"] = (matmul.quantize_q8_1, (f32_2, *act, t.int64))
    found["add_norm_quant"] = (norms.add_norm_quant, (f32_2, f32_2, f32_1, f32_1, t.float32,
                                                      i32_1, f32_2, *act))
    found["glu_quant"] = (norms.glu_quant, (f32_2, t.boolean, f32_2, *act))
    found["rope_store"] = (attention.rope_store, (
        f32_2, f32_1, f32_1, t.float32, f32_2, f32_2, t.boolean, t.int64, t.float32, i32_1,
        i32_1, i32_2, f32_3, f32_3, f16_4, f16_4))  # ... positions, slots, tables, ...
    found["attention"] = (attention.attention, (f32_3, f16_4, f16_4, i32_1, i32_2, i32_1,
                                                t.int64, t.float32, f32_2, *act))
    return found


def compile_all(cc: tuple[int, int]) -> dict[str, str]:
    """PTX of every kernel for compute capability cc."""
    from numba import cuda
    from numba.cuda import dispatcher

    if cuda.config.ENABLE_CUDASIM:
        raise RuntimeError("PTX needs the real CUDA target: run with NUMBA_ENABLE_CUDASIM=0")
    # device functions are compiled for the current device's capability; with no device
    # there is none, so name the target's (compile_ptx does so only for the kernel itself)
    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=cc)
    out = {}
    for name, (kernel, sig) in kernel_signatures().items():
        fn = getattr(kernel, "py_func", kernel)
        out[name], _ = cuda.compile_ptx(fn, sig, cc=cc)
    return out


def summary(ptx: str) -> dict:
    return {"bytes": len(ptx), "dp4a": "dp4a.s32.s32" in ptx, "shfl": "shfl.sync" in ptx,
            "target": next((line.split()[1] for line in ptx.splitlines()
                            if line.startswith(".target")), None)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="every CUDA kernel's PTX, with no GPU")
    ap.add_argument("cc", nargs="*", default=["80", "90"], help="compute capabilities: 80 90")
    ap.add_argument("--out", type=Path, default=None, help="write DIR/sm_CC/NAME.ptx")
    args = ap.parse_args(argv)
    result = {}
    for arg in args.cc:
        cc = (int(arg[:-1]), int(arg[-1]))
        kernels = compile_all(cc)
        result[f"sm_{arg}"] = {name: summary(ptx) for name, ptx in kernels.items()}
        if args.out:
            (args.out / f"sm_{arg}").mkdir(parents=True, exist_ok=True)
            for name, ptx in kernels.items():
                (args.out / f"sm_{arg}" / f"{name}.ptx").write_text(ptx)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
