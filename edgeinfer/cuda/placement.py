"""Which layers go to the GPU: llama.cpp's -ngl semantics and an Ollama-style fit for `auto`.

The last N repeating layers go first, the output layer counts as one more (N = n_layer + 1
offloads it too), the token embedding stays on the CPU. `auto` offloads as many as fit the
device's free memory after the reserves: the activation buffers, and CUDA's own context and
allocator slack (Ollama reserves 457 MiB per CUDA GPU for it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edgeinfer.errors import EdgeInferError

CUDA_RESERVE = 457 << 20  # Ollama's minimum free memory per CUDA device
MIB = 1 << 20


@dataclass(frozen=True)
class Device:
    index: int
    name: str
    compute_capability: tuple[int, int]
    free: int  # bytes
    total: int


@dataclass(frozen=True)
class Placement:
    n_gpu: int  # layers offloaded, n_layer + 1 with the output head
    notes: list[str] = field(default_factory=list)  # llama.cpp's load lines, or a warning


def parse_gpu_layers(value: str | int | None) -> int | str:
    """-ngl's value: a count, 'all' or 'auto' (a bad one raises EdgeInferError)."""
    if value is None:
        return 0
    if isinstance(value, int):
        if value < 0:
            return "all"  # llama.cpp: a negative count offloads everything
        return value
    text = str(value).strip().lower()
    if text in ("all", "auto"):
        return text
    try:
        return parse_gpu_layers(int(text))
    except ValueError:
        raise EdgeInferError(f"--gpu-layers: expected a number, 'all' or 'auto', got "
                             f"'{value}'") from None


def cuda_devices() -> list[Device] | str:
    """The CUDA devices, or why there are none (numba-cuda missing, no driver or device).
    Under numba-cuda's simulator: one simulated device with the host's free memory."""
    import importlib

    try:
        cuda = importlib.import_module("numba.cuda")
    except ImportError:
        cuda = None
    if getattr(cuda, "implementation", None) != "NVIDIA":  # not numba's deprecated built-in
        return "numba-cuda is not installed (pip install 'edgeinfer[cuda]')"
    if cuda.config.ENABLE_CUDASIM:
        import psutil

        mem = psutil.virtual_memory()
        return [Device(0, "numba-cuda simulator", (9, 0), mem.available, mem.total)]
    try:
        if not cuda.is_available():
            return "no CUDA device or driver found"
        found = []
        for dev in cuda.list_devices():
            with cuda.gpus[dev.id]:
                free, total = cuda.current_context().get_memory_info()
                name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
                found.append(Device(dev.id, name, tuple(dev.compute_capability), free, total))
        return found or "no CUDA device found"
    except Exception as e:  # driver errors come as several exception types
        return f"CUDA is unavailable ({str(e).strip().splitlines()[0] if str(e) else e})"


def kv_bytes(config, n_ctx: int, n_slots: int) -> int:
    """One layer's F16 K and V on the device."""
    return 2 * n_slots * config.n_head_kv * n_ctx * config.head_dim * 2


def layer_bytes(weights) -> tuple[list[int], int]:
    """Device bytes of each repeating layer's weights and of the output head's."""
    per_layer = []
    for b in weights.blocks:
        linears = (b.attn_q, b.attn_k, b.attn_v, b.attn_output, b.ffn_gate, b.ffn_up,
                   b.ffn_down)
        per_layer.append(sum(lin.weight.nbytes for lin in linears))
    return per_layer, weights.output.weight.nbytes


def buffer_bytes(config, n_batch: int) -> int:
    """The device activation buffers (offload.DeviceBuffers) and the head's logits."""
    c = config
    n_in = max(c.n_embd, c.n_head * c.head_dim, c.n_ff)
    floats = n_batch * (3 * c.n_embd + (2 * c.n_head + 3 * c.n_head_kv) * c.head_dim
                        + c.n_head * c.head_dim + 3 * c.n_ff + n_in // 16) + 32 * c.n_vocab
    return 4 * floats + n_batch * n_in


def fit(free: int, per_layer: list[int], head: int, reserve: int) -> int:
    """How many layers fit `free` bytes after `reserve`: the last layers first, the head
    (one more) only once every layer fits, as llama.cpp counts them."""
    budget, n = free - reserve, 0
    for size in reversed(per_layer):
        if size > budget:
            return n
        budget -= size
        n += 1
    return n + 1 if head <= budget else n


def place(request: int | str, config, weights, n_ctx: int, n_slots: int,
          n_batch: int) -> Placement:
    """How many layers to offload for a parsed -ngl value, with the lines to print."""
    n_layer = config.n_layer
    if request == 0:
        return Placement(0)
    devices = cuda_devices()
    if isinstance(devices, str):
        return Placement(0, [f"warning: --gpu-layers: {devices}; running on the CPU"])
    device = devices[0]
    per_layer, head = layer_bytes(weights)
    kv = kv_bytes(config, n_ctx, n_slots)
    if request == "auto":
        n = fit(device.free, [size + kv for size in per_layer], head,
                CUDA_RESERVE + buffer_bytes(config, n_batch))
    else:
        n = n_layer + 1 if request == "all" else min(int(request), n_layer + 1)
    return Placement(n, offload_lines(n, n_layer, per_layer, head, kv, device))


def offload_lines(n: int, n_layer: int, per_layer: list[int], head: int, kv: int,
                  device: Device) -> list[str]:
    """llama.cpp's load_tensors lines for n offloaded layers."""
    repeating = min(n, n_layer)
    lines = [f"load_tensors: using device CUDA{device.index} ({device.name}) - "
             f"{device.free // MIB} MiB free"]
    lines.append(f"load_tensors: offloading {repeating} repeating layers to GPU")
    if n > n_layer:
        lines.append("load_tensors: offloading output layer to GPU")
    lines.append(f"load_tensors: offloaded {n}/{n_layer + 1} layers to GPU")
    size = sum(per_layer[n_layer - repeating :]) + (head if n > n_layer else 0)
    lines.append(f"load_tensors: {'CUDA' + str(device.index):>12} model buffer size = "
                 f"{size / MIB:10.2f} MiB")
    lines.append(f"llama_kv_cache: {'CUDA' + str(device.index):>12} KV buffer size = "
                 f"{repeating * kv / MIB:10.2f} MiB")
    return lines
