"""`edgeinfer info MODEL`: what a GGUF file holds and what running it costs, without
compiling anything (numba is imported only to list CUDA devices, when numba-cuda is there).

Every value from the file is data, never markup: rows are rich `Text` (no markup parsing) and
file strings are made printable and cut (`errors.printable`), so a name holding `[/bad]` or an
escape sequence prints as the characters it is."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table
from rich.text import Text

from edgeinfer.errors import printable


def info_command(model: str | None, n_ctx: int, console: Console | None = None) -> None:
    from edgeinfer.pull import resolve_model
    from edgeinfer.validate import open_model

    path = resolve_model(model)
    gguf, _, config = open_model(path)
    n_ctx = n_ctx or min(4096, config.n_ctx_train)
    table = Table(show_header=False, box=None, pad_edge=False)
    for key, value in describe(path, gguf, config, n_ctx):
        table.add_row(Text(key, style="bold"), Text(value))
    (console or Console()).print(table)


def describe(path, gguf, config, n_ctx: int) -> list[tuple[str, str]]:
    meta = gguf.metadata
    n_params = sum(_numel(t.shape) for t in gguf.tensors.values())
    types = Counter(t.type_name for t in gguf.tensors.values())
    weights = path.stat().st_size
    kv = config.kv_cache_bytes(n_ctx)
    template = meta.get("tokenizer.chat_template")
    rows = [
        ("file", f"{path} ({_mib(weights)})"),
        ("name", printable(config.name)),
        ("architecture", config.arch),
        ("parameters", f"{n_params / 1e6:.1f} M"),
        ("tensor types", ", ".join(f"{name} x{n}" for name, n in types.most_common())),
        ("layers", str(config.n_layer)),
        ("embedding", str(config.n_embd)),
        ("heads", f"{config.n_head} (kv {config.n_head_kv}, head dim {config.head_dim})"),
        ("feed-forward", str(config.n_ff)),
        ("rope", f"{'neox' if config.rope_neox else 'norm'}, base {config.rope_base:g}, "
                 f"{config.n_rot} dims"),
        ("attention", _attention_layout(config)),
        ("context", f"{config.n_ctx_train} trained, {n_ctx} used here"),
        ("tokenizer", f"{printable(meta.get('tokenizer.ggml.model', '?'), 40)} "
                      f"(pre {printable(meta.get('tokenizer.ggml.pre', 'default'), 40)}), "
                      f"{config.n_vocab} tokens"),
        ("chat template", _first_line(template) if template else "none (ChatML is used)"),
        ("memory", f"weights {_mib(weights)} (memory-mapped) + KV cache {_mib(kv)} "
                   f"(F16, {n_ctx} tokens) = {_mib(weights + kv)}"),
    ]
    return rows + cuda_rows(gguf, config, n_ctx)


def cuda_rows(gguf, config, n_ctx: int) -> list[tuple[str, str]]:
    """Each CUDA device, its free memory and how many of the model's layers fit it (what
    -ngl auto would offload), or why there is none."""
    from edgeinfer.cuda import placement

    devices = placement.cuda_devices()
    if isinstance(devices, str):
        return [("CUDA", devices)]
    per_layer = [sum(t.n_bytes for name, t in gguf.tensors.items()
                     if name.startswith(f"blk.{il}.") and len(t.shape) == 2)
                 for il in range(config.n_layer)]
    head = gguf.tensors.get("output.weight") or gguf.tensors.get("token_embd.weight")
    kv = placement.kv_bytes(config, n_ctx, 1)
    reserve = placement.CUDA_RESERVE + placement.buffer_bytes(config, 512)
    rows = []
    for d in devices:
        n = placement.fit(d.free, [size + kv for size in per_layer],
                          head.n_bytes if head else 0, reserve)
        rows.append((f"CUDA{d.index}", f"{printable(d.name, 60)}, sm_{d.compute_capability[0]}"
                     f"{d.compute_capability[1]}, {_mib(d.free)} free of {_mib(d.total)}: "
                     f"{n}/{config.n_layer + 1} layers fit (-ngl auto)"))
    return rows


def _attention_layout(config) -> str:
    if not any(config.swa_layers):
        return "full causal on every layer"
    local = sum(config.swa_layers)
    pattern = "".join("L" if s else "G" for s in config.swa_layers)
    return (f"sliding window {config.sliding_window} on {local} local layers (rope base "
            f"{config.rope_base_swa:g}), {config.n_layer - local} global: {pattern}")


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return f"{len(text)} chars: {printable(line, 60)}"


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
