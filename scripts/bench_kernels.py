"""Benchmark the registered matmul kernels (a benchmark, not a test).

Decode (n_tok=1): GB/s of weight bytes read, weights cold (a pool of copies larger than the
last-level cache is cycled through), median of --runs calls, next to the machine's streaming
read bandwidth measured by a plain Numba sum loop. Prefill (n_tok = --prefill): GFLOP/s.

    python scripts/bench_kernels.py -t 1,2 --json bench.json
    python scripts/bench_kernels.py --shapes small --all-prefill --batch 8 --types Q5_0,Q4_K
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numba
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from edgeinfer.kernels import registry
from edgeinfer.linear import ActScratch

SHAPE_SETS = {  # (n_out, n_in)
    "7b": [(4096, 4096), (11008, 4096)],
    # the real test models: gemma-3-270m (640 wide, ffn 2048), SmolLM2-135M (576, ffn 1536)
    "small": [(1024, 640), (2048, 640), (640, 2048), (1536, 576), (576, 1536)],
}
SHAPES = SHAPE_SETS["7b"]
FLOAT_DTYPES = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.BF16: np.uint16,
}


@numba.njit(parallel=True, cache=True, fastmath=True)
def _stream_sum(a):
    s = np.float32(0.0)
    for i in numba.prange(a.shape[0]):
        s += a[i]
    return s


def last_level_cache_bytes() -> int:
    sizes = [0]
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        text = (index / "size").read_text().strip() if (index / "size").exists() else "0K"
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        sizes.append(int(text[:-1]) * units.get(text[-1], 1) if text[-1] in units else int(text))
    return max(sizes)


def random_weights(qtype: GGMLQuantizationType, n_out: int, n_in: int, rng) -> np.ndarray:
    """Weights with the kernel's layout: rows of bytes, as Linear.from_tensor hands them over
    (a float16 array itself is not a type Numba takes). Quantized bytes are drawn below 0x3C
    so that every f16 scale, wherever a format keeps it, is finite and small (values do not
    change speed)."""
    if qtype in FLOAT_DTYPES:
        w = rng.standard_normal((n_out, n_in), dtype=np.float32) * 0.02
        if qtype == GGMLQuantizationType.BF16:
            w = (w.view(np.uint32) >> 16).astype(np.uint16)
        return w.astype(FLOAT_DTYPES[qtype]).view(np.uint8).reshape(n_out, -1)
    block, type_size = GGML_QUANT_SIZES[qtype]
    return rng.integers(0, 0x3C, (n_out, n_in // block * type_size), dtype=np.uint8)


def activation_buffers(fmt, n_tok: int, n_in: int, rng):
    """Quantized activations in the runtime's own (cache-line aligned) scratch buffers."""
    x = rng.standard_normal((n_tok, n_in), dtype=np.float32)
    bufs = ActScratch(n_tok, n_in).views(fmt.act, n_tok, n_in)
    fmt.act.quantize(x, *bufs)
    return x, bufs


def time_calls(fn, args_list, runs: int) -> tuple[float, float]:
    """(median, best) seconds of one call, cycling through args_list round robin. The best
    is the steadier figure when other processes share the machine."""
    fn(*args_list[0])  # compile / warm
    times = []
    for k in range(runs):
        args = args_list[k % len(args_list)]
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def bench_decode(fmt, n_out: int, n_in: int, pool_bytes: int, runs: int, rng) -> dict:
    w = random_weights(fmt.qtype, n_out, n_in, rng)
    copies = [w] + [w.copy() for _ in range(max(1, -(-pool_bytes // w.nbytes)) - 1)]
    x, act = activation_buffers(fmt, 1, n_in, rng)
    out = np.zeros((1, n_out), np.float32)
    sec, best = time_calls(fmt.matmul, [(c, *act, out) for c in copies], runs)
    quant_sec, _ = time_calls(fmt.act.quantize, [(x, *act)], runs)
    return {
        "seconds": sec,
        "gb_s": w.nbytes / sec / 1e9,
        "gb_s_best": w.nbytes / best / 1e9,
        "weight_bytes": w.nbytes,
        "copies": len(copies),
        "quantize_us": quant_sec * 1e6,
    }


def bench_prefill(fmt, n_out: int, n_in: int, n_tok: int, runs: int, rng) -> dict:
    w = random_weights(fmt.qtype, n_out, n_in, rng)
    _, act = activation_buffers(fmt, n_tok, n_in, rng)
    out = np.zeros((n_tok, n_out), np.float32)
    sec, best = time_calls(fmt.matmul, [(w, *act, out)], runs)
    flop = 2.0 * n_out * n_in * n_tok
    return {
        "n_tok": n_tok,
        "seconds": sec,
        "gflop_s": flop / sec / 1e9,
        "gflop_s_best": flop / best / 1e9,
    }


def stream_bandwidth(pool_bytes: int, runs: int) -> float:
    a = np.ones(pool_bytes // 4, np.float32)
    return a.nbytes / time_calls(_stream_sum, [(a,)], runs)[0] / 1e9


def registered_types() -> list[GGMLQuantizationType]:
    try:
        return registry.supported_types()
    except ImportError as err:  # a kernel module that has not landed yet (e.g. kquants)
        print(f"warning: {err}; benchmarking the modules that import", flush=True)
        import edgeinfer.kernels.legacy  # noqa: F401  (registers itself)

        return sorted(registry.QUANT_FORMATS, key=int)


def run(threads: int, args, rng) -> dict:
    numba.set_num_threads(threads)
    stream = stream_bandwidth(args.pool_bytes, max(args.runs, 5))
    result = {"threads": threads, "stream_gb_s": stream, "decode": [], "prefill": []}
    for qtype in registered_types():
        if args.types and qtype.name not in args.types:
            continue
        fmt = registry.quant_format(qtype)
        for n_out, n_in in SHAPES:
            row = bench_decode(fmt, n_out, n_in, args.pool_bytes, args.runs, rng)
            row.update(type=qtype.name, n_out=n_out, n_in=n_in, ratio=row["gb_s"] / stream)
            result["decode"].append(row)
            print(
                f"  {qtype.name:5s} {n_out:5d}x{n_in:<5d} {row['gb_s']:6.2f} GB/s "
                f"(best {row['gb_s_best']:5.2f}) "
                f"({row['ratio']:4.0%} of stream)  quantize {row['quantize_us']:6.1f} us",
                flush=True,
            )
        for n_tok in args.prefill:
            for n_out, n_in in SHAPES[: len(SHAPES) if args.all_prefill else 1]:
                row = bench_prefill(fmt, n_out, n_in, n_tok, args.prefill_runs, rng)
                row.update(type=qtype.name, n_out=n_out, n_in=n_in)
                result["prefill"].append(row)
                print(
                    f"  {qtype.name:5s} {n_out:5d}x{n_in:<5d} prefill{n_tok} "
                    f"{row['gflop_s_best']:6.1f} GFLOP/s (best)",
                    flush=True,
                )
        for n_tok in args.batch:  # batched decode: tokens/s against one token
            n_out, n_in = SHAPES[0]
            one = bench_prefill(fmt, n_out, n_in, 1, args.runs, rng)["seconds"]
            many = bench_prefill(fmt, n_out, n_in, n_tok, args.runs, rng)["seconds"]
            row = {"type": qtype.name, "n_tok": n_tok, "speedup": n_tok * one / many}
            result.setdefault("batch", []).append(row)
            print(
                f"  {qtype.name:5s} batch of {n_tok}: {row['speedup']:4.2f}x the tokens/s "
                "of one (weights warm)",
                flush=True,
            )
    return result


def print_table(result: dict) -> None:
    print(f"\nthreads={result['threads']}  stream read {result['stream_gb_s']:.1f} GB/s")
    prefill = {
        (r["type"], r["n_tok"]): r["gflop_s"]
        for r in result["prefill"]
        if (r["n_out"], r["n_in"]) == SHAPES[0]
    }
    toks = sorted({n for _, n in prefill})
    head = "type   " + "".join(f"{n_out}x{n_in} GB/s (ratio)  " for n_out, n_in in SHAPES)
    print(head + "".join(f"prefill{n} GFLOP/s  " for n in toks))
    types = list(dict.fromkeys(r["type"] for r in result["decode"]))
    for name in types:
        rows = [r for r in result["decode"] if r["type"] == name]
        cells = "".join(f"{r['gb_s']:10.2f} ({r['ratio']:4.0%})       " for r in rows)
        pre = "".join(f"{prefill.get((name, n), float('nan')):17.1f}  " for n in toks)
        print(f"{name:6s} {cells}{pre}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-t", "--threads", default="1", help="thread counts, e.g. 1,2")
    parser.add_argument("--runs", type=int, default=20, help="decode calls per measurement")
    parser.add_argument("--prefill", default="64,512", help="prefill token counts ('' = none)")
    parser.add_argument("--prefill-runs", type=int, default=3)
    parser.add_argument(
        "--pool-mb",
        type=int,
        default=0,
        help="bytes of weight copies cycled through (default 2x LLC, >=1 GiB)",
    )
    parser.add_argument("--types", default="", help="comma-separated type names (default all)")
    parser.add_argument("--shapes", default="7b", choices=sorted(SHAPE_SETS))
    parser.add_argument("--all-prefill", action="store_true", help="prefill at every shape")
    parser.add_argument("--batch", default="", help="batched-decode token counts, e.g. 8")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    args.prefill = [int(n) for n in args.prefill.split(",") if n]
    args.types = {s.strip().upper() for s in args.types.split(",") if s.strip()}
    args.batch = [int(n) for n in args.batch.split(",") if n]
    global SHAPES
    SHAPES = SHAPE_SETS[args.shapes]
    args.pool_bytes = args.pool_mb << 20 or max(1 << 30, 2 * last_level_cache_bytes())
    rng = np.random.default_rng(0)
    results = []
    for threads in [int(t) for t in args.threads.split(",")]:
        print(f"threads={threads}", flush=True)
        results.append(run(threads, args, rng))
        print_table(results[-1])
    if args.json:
        meta = {
            "machine": platform.processor() or platform.machine(),
            "numba": numba.__version__,
            "pool_bytes": args.pool_bytes,
        }
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()
