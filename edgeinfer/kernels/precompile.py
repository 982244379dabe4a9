"""A second process that compiles kernels into Numba's disk cache while a cold load runs.

Numba compiles on one core, holding the GIL, and the first run of a model compiles about 150
kernels (25-60 s). So on a cold cache `api.Model.load` starts this module in a child process
(`python -m edgeinfer.kernels.precompile MODEL [--flash]`), which compiles the kernels in
about the reverse of the load's order: the load compiles the layer loop's attention and row
kernels, then the matrix products from the first layer's, then the output head's at the
warm-up; the child the head's product first, then the others from the last layer's back,
then the row kernels and attention. They meet in the middle, and what one has cached the
other loads in milliseconds. Both compile for the same argument types (native.SIGNATURES)
and CPU target (the child inherits the environment), so they share each cache entry; Numba
writes cache files through a rename, so a child stopped halfway leaves no broken entry.
Whatever the child has not finished, the loading process compiles itself, as without it.
"""

from __future__ import annotations

import os
import subprocess
import sys


def start(model: str, flash_attn: bool) -> subprocess.Popen | None:
    """The child process, or None on a single core (it would only take turns) or in a
    frozen executable (no interpreter to start this module with)."""
    if (os.cpu_count() or 1) < 2 or getattr(sys, "frozen", False):
        return None
    args = [sys.executable, "-m", __name__, str(model)] + (["--flash"] if flash_attn else [])
    try:
        return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    except OSError:  # no process to spare: compile everything here
        return None


def stop(child: subprocess.Popen | None) -> None:
    """End the child once the load is done (what it still compiles, the load already has)."""
    if child is not None and child.poll() is None:
        child.terminate()
        child.wait()


def compile_layer_kernels(flash_attn: bool) -> None:
    """The kernels layers.kernels() asks for, in the reverse of its order (attention last),
    every row kernel variant whether this model uses it or not (a few seconds; cached for
    later)."""
    import numba

    from edgeinfer.kernels import attention, flash, native, ops

    # the thread pool first, as the load does (process.set_threads): a parallel kernel already in
    # the cache links against its symbols, and without them LLVM aborts the process
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    for kind in ("swiglu", "geglu"):
        for kernel in ops.ROW_KERNELS[kind]:
            native.address(kernel, kind)
    native.address(attention.store_kv, "store_kv")
    for kind in ("add_bias", "add_inplace", "scale_inplace"):
        native.address(getattr(ops, kind), kind)
    native.address(ops.rope, "rope")
    for kind in ("rms_norm_inplace", "rms_norm"):
        for kernel in ops.ROW_KERNELS[kind]:
            native.address(kernel, kind)
    if flash_attn:
        flash.task_address()
        native.address(flash.flash_attention, "attention")
    else:
        attention.task_address()
        native.address(attention.attention, "attention")


def compile_products(model: str) -> None:
    """The model's matrix products and activation quantizers in the reverse of the order in
    which the load compiles them (layers.layer_table, then the output head at the warm-up)."""
    from edgeinfer.kernels import native
    from edgeinfer.layers import LINEARS
    from edgeinfer.validate import open_model
    from edgeinfer.weights import load_weights

    gguf, arch, config = open_model(model)
    weights = load_weights(gguf, config, arch)
    formats = [getattr(b, name).fmt for b in weights.blocks for name in LINEARS]
    for fmt in dict.fromkeys([weights.output.fmt] + formats[::-1]):
        native.address(fmt.act.quantize, "quantize")
        native.address(fmt.matmul, "matmul")


if __name__ == "__main__":
    compile_products(sys.argv[1])
    compile_layer_kernels("--flash" in sys.argv[2:])
