"""GGUF reader: metadata and zero-copy tensor views over one memory map.

We parse the header ourselves instead of using `gguf.GGUFReader` because that reader builds
numpy objects for every array element, which takes seconds on a large vocabulary
(docs/tokenizer.md, "Reading the vocabulary"); this one reads string arrays in a tight loop
and hands out numeric arrays and tensors as `np.frombuffer` views of the map, so weights stay
quantized and are paged in by the OS only when a kernel touches them.

Layout (gguf-py/gguf/constants.py, GGUF spec): magic "GGUF", u32 version, u64 n_tensors,
u64 n_kv, the key/value section, tensor infos (name, n_dims, dims innermost-first, type,
offset), padding to `general.alignment` (default 32), then tensor data.

Every count, length, type, dimension and offset is checked as it is read, against the bytes
left in the file and llama.cpp's limits, in the order of its reader (ggml/src/gguf.cpp,
gguf_init_from_file_impl), before anything is allocated from it; a failure is one line that
names the key or tensor. The hyperparameters are checked next, by `edgeinfer.config`, and the
tensors against them by `edgeinfer.validate`.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from edgeinfer.errors import EdgeInferError, printable

SUPPORTED_VERSIONS = (2, 3)
MAX_STRING = 1 << 30  # GGUF_MAX_STRING_LENGTH, ggml/src/gguf.cpp
MAX_ARRAY = 1 << 30  # GGUF_MAX_ARRAY_ELEMENTS
MAX_NAME = 64  # GGML_MAX_NAME: a tensor name has fewer bytes
MAX_DIMS = 4  # GGML_MAX_DIMS
INT64_MAX = 2**63 - 1
DEFAULT_ALIGNMENT = 32
MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, a one-byte key, value type, a u8 value
MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 4 + 8  # name length and a byte, n_dims, type, offset

# GGUF value type -> (struct format, numpy dtype); 8 = string, 9 = array.
_SCALAR = {
    0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16), 3: ("<h", np.int16),
    4: ("<I", np.uint32), 5: ("<i", np.int32), 6: ("<f", np.float32), 7: ("<?", np.bool_),
    10: ("<Q", np.uint64), 11: ("<q", np.int64), 12: ("<d", np.float64),
}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
TYPE_NAMES = {0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32",
              6: "float32", 7: "bool", 8: "string", 9: "array", 10: "uint64", 11: "int64",
              12: "float64"}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: int  # GGML type id, kept as int so unknown types can still be reported by name
    shape: tuple[int, ...]  # numpy order: outermost first, e.g. (n_out, n_in)
    offset: int  # absolute byte offset in the file
    n_bytes: int

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.qtype).name
        except ValueError:
            return f"type {self.qtype}"


class _Cursor:
    """Sequential little-endian reads; every length is checked against the bytes left
    before it is used, so running off the end is a clear error naming what was read."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def fail(self, message: str) -> EdgeInferError:
        return EdgeInferError(f"{self.path}: {message}")

    @property
    def remaining(self) -> int:
        return len(self.buf) - self.pos

    def take(self, n: int, what: str) -> int:
        if n > self.remaining:
            raise self.fail(f"truncated GGUF file ({what} runs past the end)")
        start = self.pos
        self.pos += n
        return start

    def scalar(self, fmt: str, what: str) -> Any:
        size = struct.calcsize(fmt)
        return struct.unpack_from(fmt, self.buf, self.take(size, what))[0]

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        if n > MAX_STRING:
            raise self.fail(f"{what}: string length {n} exceeds the maximum {MAX_STRING}")
        if n > self.remaining:
            raise self.fail(f"truncated GGUF file ({what}: a string of {n} bytes runs past "
                            f"the end)")
        start = self.take(n, what)
        return bytes(self.buf[start : start + n]).decode("utf-8", errors="surrogateescape")

    def value(self, vtype: int, key: str) -> Any:
        if vtype == _STRING:
            return self.string(f"key '{key}'")
        if vtype == _ARRAY:
            return self.array(key)
        if vtype not in _SCALAR:
            raise self.fail(f"key '{key}' has invalid GGUF type {vtype}")
        return self.scalar(_SCALAR[vtype][0], f"key '{key}'")

    def array(self, key: str) -> Any:
        etype = self.scalar("<I", f"key '{key}'")
        count = self.scalar("<Q", f"key '{key}'")
        if etype == _ARRAY:  # gguf.cpp refuses them too: no recursion on crafted depth
            raise self.fail(f"key '{key}' is an array of arrays (not supported)")
        if etype != _STRING and etype not in _SCALAR:
            raise self.fail(f"key '{key}' has invalid GGUF array type {etype}")
        itemsize = 8 if etype == _STRING else np.dtype(_SCALAR[etype][1]).itemsize
        if count > MAX_ARRAY or count * itemsize > self.remaining:
            raise self.fail(f"truncated GGUF file (key '{key}': an array of {count} "
                            f"{TYPE_NAMES[etype]} values runs past the end)")
        if etype == _STRING:
            return self._string_array(count, key)
        dtype = np.dtype(_SCALAR[etype][1])
        start = self.take(count * dtype.itemsize, f"key '{key}'")
        return np.frombuffer(self.buf, dtype=dtype, count=count, offset=start).copy()

    def _string_array(self, count: int, key: str) -> list[str]:
        buf, pos, out = self.buf, self.pos, []
        unpack = struct.Struct("<Q").unpack_from
        end = len(buf)
        for _ in range(count):
            if pos + 8 > end:
                break
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > end:
                break
            out.append(buf[pos : pos + n].decode("utf-8", errors="surrogateescape"))
            pos += n
        self.pos = pos
        if len(out) != count:
            raise self.fail(f"truncated GGUF file (key '{key}': string {len(out)} of {count} "
                            f"runs past the end)")
        return out


class GGUFFile:
    """An open GGUF file: `metadata` (dict), `tensors` (name -> TensorInfo), `tensor(name)`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._map = _open_map(self.path)
        cur = _Cursor(self._map, self.path)
        self.version = _read_header(cur)
        n_tensors = cur.scalar("<Q", "the tensor count")
        n_kv = cur.scalar("<Q", "the key-value count")
        if n_tensors > cur.remaining // MIN_TENSOR_INFO_BYTES:
            raise cur.fail(f"corrupt GGUF header: {n_tensors} tensors cannot fit in the file")
        if n_kv > cur.remaining // MIN_KV_BYTES:
            raise cur.fail(f"corrupt GGUF header: {n_kv} key-value pairs cannot fit in the file")
        self.metadata: dict[str, Any] = {}
        self.value_types: dict[str, int] = {}  # GGUF value type of each key
        for i in range(n_kv):
            _read_kv(cur, i, self.metadata, self.value_types)
        align = _alignment(cur, self.metadata, self.value_types)
        infos: dict[str, tuple] = {}
        for i in range(n_tensors):
            info = _read_tensor_info(cur, i)
            if info[0] in infos:
                raise cur.fail(f"duplicate tensor name '{printable(info[0])}'")
            infos[info[0]] = info
        self.data_offset = -(-cur.pos // align) * align
        self.tensors = _place_tensors(cur, infos.values(), self.data_offset, align)
        _release_pages(self._map, self.data_offset)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def tensor(self, name: str) -> np.ndarray:
        """A zero-copy view: float arrays for F32/F16 (BF16 as uint16 bits), else the raw
        (n_rows, row_bytes) uint8 blocks."""
        info = self.tensors[name]
        dtype = {0: np.float32, 1: np.float16, 30: np.uint16}.get(info.qtype)
        if dtype is not None:
            count = int(np.prod(info.shape))
            arr = np.frombuffer(self._map, dtype=dtype, count=count, offset=info.offset)
            return arr.reshape(info.shape)
        arr = np.frombuffer(self._map, dtype=np.uint8, count=info.n_bytes, offset=info.offset)
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        return arr.reshape(rows, info.n_bytes // rows)


def _read_header(cur: _Cursor) -> int:
    if len(cur.buf) < 4 or bytes(cur.buf[:4]) != b"GGUF":
        raise cur.fail("not a GGUF file (bad magic)")
    cur.take(4, "the magic")
    version = cur.scalar("<I", "the version")
    if version and not version & 0xFFFF:
        raise cur.fail(f"GGUF version {version} is extremely large: a big-endian file?")
    if version not in SUPPORTED_VERSIONS:
        raise cur.fail(f"unsupported GGUF version {version} (supported: 2, 3)")
    return version


def _read_kv(cur: _Cursor, i: int, metadata: dict, types: dict) -> None:
    key = cur.string(f"key {i}")
    if not key:
        raise cur.fail(f"corrupt GGUF metadata: key {i} is empty")
    name = printable(key)
    if key in metadata:
        raise cur.fail(f"corrupt GGUF metadata: duplicate key '{name}'")
    vtype = cur.scalar("<I", f"key '{name}'")
    metadata[key] = cur.value(vtype, name)
    types[key] = vtype


def _alignment(cur: _Cursor, metadata: dict, types: dict) -> int:
    if "general.alignment" not in metadata:
        return DEFAULT_ALIGNMENT
    if types["general.alignment"] != _UINT32:
        kind = TYPE_NAMES.get(types["general.alignment"])
        raise cur.fail(f"key 'general.alignment' must be of type uint32, not {kind}")
    align = metadata["general.alignment"]
    if align == 0 or align & (align - 1):
        raise cur.fail(f"general.alignment {align} is not a power of 2")
    return align


def _read_tensor_info(cur: _Cursor, i: int) -> tuple[str, tuple[int, ...], int, int, int]:
    """(name, dims innermost first, ggml type, offset in the data section, bytes)."""
    name = cur.string(f"tensor {i}'s name")
    if len(name.encode("utf-8", "surrogateescape")) >= MAX_NAME:
        raise cur.fail(f"tensor {i}'s name is too long (at most {MAX_NAME - 1} bytes): "
                       f"'{printable(name)}'")
    shown = printable(name)
    n_dims = cur.scalar("<I", f"tensor '{shown}'")
    if n_dims > MAX_DIMS:
        raise cur.fail(f"tensor '{shown}' has {n_dims} dimensions (at most {MAX_DIMS})")
    dims = tuple(cur.scalar("<Q", f"tensor '{shown}'") for _ in range(n_dims))
    n_elem = 1
    for j, d in enumerate(dims):
        if d == 0 or d > INT64_MAX:
            raise cur.fail(f"tensor '{shown}' dimension {j} is {d}")
        n_elem *= d
        if n_elem > INT64_MAX:
            raise cur.fail(f"tensor '{shown}' has shape {dims}: over 2^63 elements")
    qtype = cur.scalar("<I", f"tensor '{shown}'")
    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    except (ValueError, KeyError):
        raise cur.fail(f"tensor '{shown}' has unknown ggml type {qtype}") from None
    row = dims[0] if dims else 1
    if row % block:
        kind = GGMLQuantizationType(qtype).name
        raise cur.fail(f"tensor '{shown}' of type {kind} has {row} elements per row, "
                       f"not a multiple of its block size {block}")
    offset = cur.scalar("<Q", f"tensor '{shown}'")
    return name, dims, qtype, offset, n_elem // block * type_size


def _place_tensors(cur: _Cursor, infos, data_offset: int, align: int) -> dict[str, TensorInfo]:
    """Tensor data follows in order, each padded to the alignment (gguf.cpp requires it);
    every tensor must lie inside the file."""
    tensors: dict[str, TensorInfo] = {}
    expected = 0
    for name, dims, qtype, rel, n_bytes in infos:
        shown = printable(name)
        if rel != expected:
            raise cur.fail(f"corrupt GGUF file: tensor '{shown}' has offset {rel}, "
                           f"expected {expected}")
        expected += -(-n_bytes // align) * align
        if data_offset + rel + n_bytes > len(cur.buf):
            raise cur.fail(f"truncated GGUF file (tensor '{shown}' runs past the end)")
        shape = tuple(reversed(dims))  # GGML lists dims innermost first
        tensors[name] = TensorInfo(name, qtype, shape, data_offset + rel, n_bytes)
    return tensors


def _release_pages(buf: mmap.mmap, end: int) -> None:
    """Unmap the resident pages of the header [0, end) from this process: it was read once,
    into Python objects (a 262k-token vocabulary's strings and scores are 6 MB of the file).
    The page cache keeps them; a later read would map them again."""
    n = min(end, len(buf)) // mmap.PAGESIZE * mmap.PAGESIZE
    if n and hasattr(mmap, "MADV_DONTNEED"):
        try:
            buf.madvise(mmap.MADV_DONTNEED, 0, n)
        except OSError:  # advice only
            pass


def _open_map(path: Path) -> mmap.mmap:
    try:
        with open(path, "rb") as f:
            if path.stat().st_size == 0:
                raise EdgeInferError(f"{path}: empty file, not a GGUF model")
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise EdgeInferError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise EdgeInferError(f"{path}: is a directory, not a GGUF file") from None
    except PermissionError:
        raise EdgeInferError(f"{path}: permission denied") from None
