"""GGUF files taken apart into fields, mutated and written back.

The raw material of the GGUF fuzzer (tests/test_gguf_fuzz.py, scripts/fuzz_gguf.py) and of
the hardening regressions (tests/test_gguf_hardening.py). A `Layout` is a file as data
(key/value pairs, tensor infos, the data section); `serialize` writes it back and records
where every fixed-width header field landed, so a mutation can rewrite one field with a
lying value (an array count, a string length, n_dims) without re-encoding the rest.

`mutate(draw, layout)` applies one to three mutations chosen by hypothesis (`mutate_mild` one
that keeps the header valid); `check_in_process`
and `check_cli` run a file through the loader, config, tokenizer tables, weight views and
`info` rendering (in this process, fast) or through the real CLI (a subprocess), and report
what happened as an `Outcome`: "ok", "refused" (an EdgeInferError, the one error a user may
see) or "failure" (anything else: a traceback, a signal, a hang, a malformed error line).
"""

from __future__ import annotations

import io
import math
import os
import signal
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from hypothesis import strategies as st
from tiny_models import write_tiny_model

STRING, ARRAY = 8, 9
FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
       11: "<q", 12: "<d"}
INT_TYPES = (0, 1, 2, 3, 4, 5, 10, 11)
FLOAT_TYPES = (6, 12)
MAX_ERROR_CHARS = 1500  # the path, a cut name or two, a list of supported names


# -- a GGUF file as data ---------------------------------------------------------------------
@dataclass
class Raw:
    """Bytes written as a value as they are (nested arrays, lying counts)."""

    data: bytes


@dataclass
class Array:
    etype: int
    items: list


@dataclass
class KV:
    key: str
    vtype: int
    value: Any  # a scalar, a str, an Array or Raw bytes


@dataclass
class Tensor:
    name: str
    dims: list[int]  # ggml order: innermost first
    ggml_type: int
    offset: int  # in the data section


@dataclass
class Layout:
    kvs: list[KV]
    tensors: list[Tensor]
    data: bytes  # the data section
    version: int = 3
    n_tensors: int | None = None  # None: len(tensors)
    n_kv: int | None = None

    def find(self, key: str) -> KV | None:
        return next((kv for kv in self.kvs if kv.key == key), None)

    def set(self, key: str, vtype: int, value: Any) -> None:
        kv = self.find(key)
        if kv is None:
            self.kvs.append(KV(key, vtype, value))
        else:
            kv.vtype, kv.value = vtype, value

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name)

    def copy(self) -> Layout:
        return replace(self, kvs=[replace(kv) for kv in self.kvs],
                       tensors=[replace(t, dims=list(t.dims)) for t in self.tensors])


def read_layout(path: Path) -> Layout:
    """A file written by GGUFWriter, taken apart with gguf-py's own reader."""
    reader = GGUFReader(str(path))
    kvs = []
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        vtype = int(f.types[0])
        value = f.contents()
        if vtype == ARRAY:
            value = Array(int(f.types[1]), list(value))
        kvs.append(KV(key, vtype, value))
    tensors = [Tensor(t.name, [int(d) for d in t.shape], int(t.tensor_type),
                      int(t.data_offset) - int(reader.data_offset)) for t in reader.tensors]
    data = Path(path).read_bytes()[reader.data_offset:]
    return Layout(kvs, tensors, data)


@dataclass(frozen=True)
class Field:
    label: str
    pos: int
    fmt: str


def _pack(fmt: str, value: Any) -> bytes:
    """struct.pack that wraps integers to the field's width and saturates floats."""
    if fmt in ("<f", "<d"):
        value = float(value)
        if fmt == "<f" and math.isfinite(value) and abs(value) > 3.4e38:
            value = math.copysign(math.inf, value)
        return struct.pack(fmt, value)
    if fmt == "<?":
        return struct.pack("<B", int(bool(value)))
    bits = struct.calcsize(fmt) * 8
    value = int(value) % (1 << bits)
    if fmt[1].islower() and value >= 1 << (bits - 1):
        value -= 1 << bits
    return struct.pack(fmt, value)


class _Writer:
    def __init__(self):
        self.buf = bytearray()
        self.fields: list[Field] = []

    def put(self, fmt: str, value: Any, label: str | None) -> None:
        if label is not None:
            self.fields.append(Field(label, len(self.buf), fmt))
        self.buf += _pack(fmt, value)

    def string(self, text: str | bytes, label: str | None) -> None:
        raw = text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape")
        self.put("<Q", len(raw), None if label is None else label + ".len")
        self.buf += raw

    def value(self, vtype: int, value: Any, label: str | None) -> None:
        if isinstance(value, Raw):
            self.buf += value.data
        elif vtype == STRING:
            self.string(value, label)
        elif vtype == ARRAY:
            self.put("<I", value.etype, None if label is None else label + ".etype")
            self.put("<Q", len(value.items), None if label is None else label + ".count")
            for j, item in enumerate(value.items):  # fields of the first few elements only
                self.value(value.etype, item, f"{label}[{j}]" if label and j < 3 else None)
        else:
            self.put(FMT[vtype], value, label)


def serialize(layout: Layout) -> tuple[bytes, list[Field]]:
    w = _Writer()
    w.buf += b"GGUF"
    w.put("<I", layout.version, "version")
    n_tensors = len(layout.tensors) if layout.n_tensors is None else layout.n_tensors
    w.put("<Q", n_tensors, "n_tensors")
    w.put("<Q", len(layout.kvs) if layout.n_kv is None else layout.n_kv, "n_kv")
    for kv in layout.kvs:
        w.string(kv.key, f"kv[{kv.key}].key")
        w.put("<I", kv.vtype, f"kv[{kv.key}].type")
        w.value(kv.vtype, kv.value, f"kv[{kv.key}]")
    for t in layout.tensors:
        label = f"tensor[{t.name}]"
        w.string(t.name, label + ".name")
        w.put("<I", len(t.dims), label + ".n_dims")
        for j, d in enumerate(t.dims):
            w.put("<Q", d, f"{label}.dim{j}")
        w.put("<I", t.ggml_type, label + ".type")
        w.put("<Q", t.offset, label + ".offset")
    align = layout.find("general.alignment")
    align = align.value if align is not None and isinstance(align.value, int) else 32
    align = align if 0 < align <= 1 << 16 and not align & (align - 1) else 32
    w.buf += bytes(-len(w.buf) % align)
    return bytes(w.buf) + layout.data, w.fields


def nested_array(depth: int) -> Raw:
    """An array of arrays `depth` deep, innermost an empty u8 array (written without
    recursion)."""
    return Raw((_pack("<I", ARRAY) + _pack("<Q", 1)) * (depth - 1) + _pack("<I", 0) +
               _pack("<Q", 0))


# -- base models ----------------------------------------------------------------------------
def write_base(path: Path, arch: str = "llama") -> Path:
    """A small valid model (~80 kB): two blocks, 64-wide, Q8_0 matrices, F32 norms."""
    return write_tiny_model(path, arch, Q.Q8_0, n_embd=64, n_ff=64, n_layer=2, n_head=2,
                            n_kv=1, head_dim=32)


# -- mutations ------------------------------------------------------------------------------
Draw = Callable[[st.SearchStrategy], Any]

INTS = [0, 1, 2, 3, 7, 8, 31, 32, 33, 255, 256, 512, 513, 2**15, 2**16, 2**31 - 1, 2**31,
        2**32 - 1, 2**32, 600_000_000, 2_000_000_000, 2**63 - 1, 2**63, 2**64 - 1, -1, -2,
        -(2**31)]
FLOATS = [math.nan, math.inf, -math.inf, 0.0, -0.0, -1.0, 1e-45, 1e-30, 1e30, 3.4e38, -1e4]
STRINGS = ["[/bad]", "[bold]x[/bold]", "[link=file:///etc]x[/link]", "\x1b[31mred\x1b[0m",
           "a\nb\r\nc", "\x00", "", "llama", "gemma3", "gpt2", "spm", "none", "yarn", "x" * 5000,
           "{% for %}", "{{ raise_exception('no') }}", "\udcff\udcfe", "é" * 40]
INTERESTING_KEYS = [
    "general.alignment", "general.architecture", "general.name", "tokenizer.ggml.model",
    "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.scores", "tokenizer.ggml.bos_token_id",
    "tokenizer.chat_template", "{arch}.block_count", "{arch}.embedding_length",
    "{arch}.attention.head_count", "{arch}.attention.head_count_kv",
    "{arch}.attention.key_length", "{arch}.attention.value_length",
    "{arch}.context_length", "{arch}.feed_forward_length", "{arch}.rope.dimension_count",
    "{arch}.rope.freq_base", "{arch}.rope.scaling.type", "{arch}.rope.scaling.factor",
    "{arch}.attention.layer_norm_rms_epsilon", "{arch}.attention.sliding_window",
    "{arch}.attention.sliding_window_pattern", "{arch}.vocab_size",
    "{arch}.final_logit_softcapping", "{arch}.rope.freq_base_swa",
]


def _any_value(draw: Draw) -> tuple[int, Any]:
    """A (GGUF type, value) of any kind, weighted to the edge cases."""
    kind = draw(st.sampled_from(["int", "float", "string", "bool", "array", "nested"]))
    if kind == "int":
        vtype = draw(st.sampled_from(INT_TYPES))
        return vtype, draw(st.sampled_from(INTS) | st.integers(-(2**63), 2**64 - 1))
    if kind == "float":
        return draw(st.sampled_from(FLOAT_TYPES)), draw(st.sampled_from(FLOATS) | st.floats())
    if kind == "string":
        return STRING, draw(st.sampled_from(STRINGS) | st.text(max_size=100))
    if kind == "bool":
        return 7, draw(st.booleans())
    if kind == "nested":
        return ARRAY, nested_array(draw(st.sampled_from([2, 3, 100, 5000, 100_000])))
    etype = draw(st.sampled_from(INT_TYPES + FLOAT_TYPES + (STRING, 7)))
    n = draw(st.sampled_from([0, 1, 2, 6, 100]))
    item = ({STRING: "t", 7: True}.get(etype, 1))
    return ARRAY, Array(etype, [item] * n)


def _mutate_kv(draw: Draw, layout: Layout, arch: str) -> None:
    op = draw(st.sampled_from(["value", "value", "same_type", "delete", "add", "duplicate",
                               "array"]))
    if op == "add" or not layout.kvs:
        key = draw(st.sampled_from(INTERESTING_KEYS)).format(arch=arch)
        layout.set(key, *_any_value(draw))
        return
    kv = draw(st.sampled_from(layout.kvs))
    if op == "delete":
        layout.kvs.remove(kv)
    elif op == "duplicate":
        layout.kvs.append(replace(kv))
    elif op == "same_type" and kv.vtype in INT_TYPES:
        kv.value = draw(st.sampled_from(INTS) | st.integers(-(2**63), 2**64 - 1))
    elif op == "same_type" and kv.vtype in FLOAT_TYPES:
        kv.value = draw(st.sampled_from(FLOATS) | st.floats())
    elif op == "same_type" and kv.vtype == STRING:
        kv.value = draw(st.sampled_from(STRINGS) | st.text(max_size=100))
    elif op == "array" and isinstance(kv.value, Array):
        items = kv.value.items
        how = draw(st.sampled_from(["cut", "empty", "extend", "retype", "nested"]))
        if how == "cut":
            kv.value = Array(kv.value.etype, items[: draw(st.integers(0, len(items)))])
        elif how == "empty":
            kv.value = Array(kv.value.etype, [])
        elif how == "extend":
            kv.value = Array(kv.value.etype, items + items[:1] * draw(st.integers(1, 300)))
        elif how == "retype":
            kv.value = Array(draw(st.sampled_from(INT_TYPES + FLOAT_TYPES)), [1] * len(items))
        else:
            kv.value = nested_array(draw(st.sampled_from([2, 1000, 5000])))
    else:
        kv.vtype, kv.value = _any_value(draw)


def _mutate_tensor(draw: Draw, layout: Layout) -> None:
    t = draw(st.sampled_from(layout.tensors))
    op = draw(st.sampled_from(["dim", "n_dims", "type", "offset", "name", "drop", "swap"]))
    if op == "dim":
        j = draw(st.integers(0, len(t.dims) - 1))
        t.dims[j] = draw(st.sampled_from([0, 1, t.dims[j] - 1, t.dims[j] + 1, t.dims[j] * 2,
                                          t.dims[j] // 2, 2**32, 2**62, 2**64 - 1]))
    elif op == "n_dims":
        t.dims = t.dims[:-1] if len(t.dims) > 1 and draw(st.booleans()) else t.dims + [1]
    elif op == "type":
        t.ggml_type = draw(st.sampled_from([int(q) for q in Q]) | st.integers(0, 2**32 - 1))
    elif op == "offset":
        t.offset = draw(st.sampled_from([t.offset + 1, t.offset - 1, t.offset + 32, 0,
                                         len(layout.data), 2**63, 2**64 - 1]))
    elif op == "name":
        other = draw(st.sampled_from(layout.tensors)).name
        t.name = draw(st.sampled_from([other, "", "x" * 70, "[/bad]", "\x1b[2J", "blk.9.x",
                                       "blk.999999999.attn_norm.weight", t.name + "\x00"]))
    elif op == "drop":
        layout.tensors.remove(t)
    else:
        t.dims = t.dims[::-1]


def _mutate_data(draw: Draw, layout: Layout) -> None:
    """NaN/inf in a float tensor: a valid header whose model computes garbage."""
    floats = [t for t in layout.tensors if t.ggml_type == 0]
    t = draw(st.sampled_from(floats))
    data = bytearray(layout.data)
    value = draw(st.sampled_from([math.nan, math.inf, -math.inf, 1e30]))
    n = t.dims[0]
    data[t.offset: t.offset + 4 * n] = np.full(n, value, np.float32).tobytes()
    layout.data = bytes(data)


def _mutate_header(draw: Draw, layout: Layout) -> None:
    what = draw(st.sampled_from(["version", "n_tensors", "n_kv"]))
    value = draw(st.sampled_from([0, 1, 2, 4, 0x03000000, 2**32 - 1, 2**63, 2**64 - 1]) |
                 st.integers(0, 2**64 - 1))
    if what == "version":
        layout.version = value
    else:
        count = len(layout.tensors if what == "n_tensors" else layout.kvs)
        value = draw(st.sampled_from([value, count + 1, max(count - 1, 0)]))
        setattr(layout, what, value)


def _mutate_bytes(draw: Draw, raw: bytes, fields: list[Field]) -> bytes:
    buf = bytearray(raw)
    op = draw(st.sampled_from(["field", "field", "truncate", "flip", "splice"]))
    header_end = max(f.pos for f in fields) + 8
    if op == "field":
        f = draw(st.sampled_from(fields))
        size = struct.calcsize(f.fmt)
        old = struct.unpack_from(f.fmt, buf, f.pos)[0]
        if f.fmt in ("<f", "<d"):
            new = draw(st.sampled_from(FLOATS) | st.floats())
        else:
            new = draw(st.sampled_from(INTS + [int(old) + 1, int(old) - 1, int(old) * 2,
                                               int(old) * 1000]))
        buf[f.pos: f.pos + size] = _pack(f.fmt, new)
    elif op == "truncate":
        cut = draw(st.integers(0, header_end) | st.integers(0, len(buf)))
        del buf[cut:]
    elif op == "flip":
        for _ in range(draw(st.integers(1, 8))):
            pos = draw(st.integers(0, min(header_end, len(buf) - 1)))
            buf[pos] ^= 1 << draw(st.integers(0, 7))
    else:
        pos = draw(st.integers(0, min(header_end, len(buf))))
        if draw(st.booleans()):
            buf[pos:pos] = bytes(draw(st.integers(1, 16)))
        else:
            del buf[pos: pos + draw(st.integers(1, 16))]
    return bytes(buf)


def mutate_mild(draw: Draw, layout: Layout) -> bytes:
    """One mutation that keeps the header valid: odd text in a string the model prints or
    renders (name, chat template), or NaN/inf weights. The CLI cases use it to reach `run`'s
    template, generation and sampler."""
    layout = layout.copy()
    if draw(st.booleans()):
        key = draw(st.sampled_from(["general.name", "tokenizer.chat_template"]))
        layout.set(key, STRING, draw(st.sampled_from(STRINGS) | st.text(max_size=100)))
    else:
        _mutate_data(draw, layout)
    return serialize(layout)[0]


def mutate(draw: Draw, layout: Layout) -> bytes:
    """One to three structured mutations, then maybe a field or byte-level one."""
    layout = layout.copy()
    arch = layout.find("general.architecture").value
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["kv", "kv", "kv", "tensor", "tensor", "header", "data"]))
        if where == "kv":
            _mutate_kv(draw, layout, arch)
        elif where == "tensor" and layout.tensors:
            _mutate_tensor(draw, layout)
        elif where == "header":
            _mutate_header(draw, layout)
        elif where == "data" and any(t.ggml_type == 0 for t in layout.tensors):
            _mutate_data(draw, layout)
    raw, fields = serialize(layout)
    if draw(st.integers(0, 2)) == 0:
        raw = _mutate_bytes(draw, raw, fields)
    return raw


# -- running a case -------------------------------------------------------------------------
@dataclass
class Outcome:
    status: str  # "ok", "refused" or "failure"
    detail: str = ""
    extra: dict = field(default_factory=dict)


class CaseTimeout(BaseException):
    """Raised by the per-case alarm (a BaseException, so no handler swallows it)."""


def _on_alarm(signum, frame):
    raise CaseTimeout()


def error_line_problem(message: str) -> str | None:
    """What is wrong with a user-facing error line, or None."""
    if "\n" in message or "\r" in message:
        return "error message spans lines"
    if not message.isprintable():
        return "error message holds unprintable characters"
    if len(message) > MAX_ERROR_CHARS:
        return f"error message of {len(message)} characters"
    return None


def check_in_process(path: Path, deadline_s: float = 10.0) -> Outcome:
    """Loader, checks, tokenizer tables, weight views and `info` rendering, in this process.
    Only EdgeInferError may escape them, as one short printable line."""
    from rich.console import Console

    from edgeinfer.commands.info import info_command
    from edgeinfer.errors import EdgeInferError
    from edgeinfer.tokenizer_tables import read_vocab
    from edgeinfer.validate import open_model
    from edgeinfer.weights import load_weights

    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, deadline_s)
    try:
        out = io.StringIO()
        info_command(str(path), 0, Console(file=out, width=100))
        gguf, arch, config = open_model(path)
        read_vocab(gguf.metadata)
        load_weights(gguf, config, arch)
    except EdgeInferError as exc:
        problem = error_line_problem(str(exc))
        return Outcome("failure" if problem else "refused", problem or str(exc))
    except CaseTimeout:
        return Outcome("failure", f"hang: over {deadline_s} s")
    except Exception as exc:  # noqa: BLE001 - what the fuzzer is looking for
        return Outcome("failure", f"{type(exc).__name__}: {str(exc)[:300]}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    text = out.getvalue()
    if len(text) > 20_000 or "\x1b" in text:
        return Outcome("failure", f"info printed {len(text)} characters"
                                  f"{' with escape sequences' if chr(27) in text else ''}")
    return Outcome("ok")


def cli(*args, timeout: float = 300.0) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([sys.executable, "-m", "edgeinfer.cli", *map(str, args)],
                          capture_output=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


RUN_ARGS = ("-p", "hi", "-n", "4", "--temp", "0", "-q", "-c", "64")


def check_cli(path: Path, command: str, timeout: float = 300.0) -> Outcome:
    """`edgeinfer info` or `run` as a user runs them: exit 0, or 1 with one `error:` line;
    no traceback, no signal, no flood, no hang."""
    args = ("info", path) if command == "info" else ("run", path, *RUN_ARGS)
    try:
        proc = cli(*args, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Outcome("failure", f"{command}: hang, over {timeout} s")
    err = proc.stderr.decode("utf-8", "replace")
    if proc.returncode < 0:
        return Outcome("failure", f"{command}: killed by signal {-proc.returncode}")
    if "Traceback" in err:
        return Outcome("failure", f"{command}: traceback: {err[-400:]}")
    if proc.returncode == 0:
        limit = 20_000 if command == "info" else 1_000
        if len(proc.stdout) > limit or err:
            return Outcome("failure", f"{command}: {len(proc.stdout)} bytes of stdout, "
                                      f"stderr {err[:200]!r}")
        return Outcome("ok")
    lines = err.splitlines()
    if proc.returncode != 1 or len(lines) != 1 or not lines[0].startswith("error: "):
        return Outcome("failure", f"{command}: exit {proc.returncode}, stderr {err[:400]!r}")
    problem = error_line_problem(lines[0])
    return Outcome("failure" if problem else "refused", problem or lines[0])
