"""GGUF reader: metadata and zero-copy tensor views over one memory map.

We parse the header ourselves instead of using `gguf.GGUFReader` because that reader builds
numpy objects for every array element, which takes seconds on a large vocabulary
(docs/tokenizer.md, "Reading the vocabulary"); this one reads string arrays in a tight loop
and hands out numeric arrays and tensors as `np.frombuffer` views of the map, so weights stay
quantized and are paged in by the OS only when a kernel touches them.

Layout (gguf-py/gguf/constants.py, GGUF spec): magic "GGUF", u32 version, u64 n_tensors,
u64 n_kv, the key/value section, tensor infos (name, n_dims, dims innermost-first, type,
offset), padding to `general.alignment` (default 32), then tensor data.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from edgeinfer.errors import EdgeInferError

SUPPORTED_VERSIONS = (2, 3)

# GGUF value type -> (struct format, numpy dtype); 8 = string, 9 = array.
_SCALAR = {
    0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16), 3: ("<h", np.int16),
    4: ("<I", np.uint32), 5: ("<i", np.int32), 6: ("<f", np.float32), 7: ("<?", np.bool_),
    10: ("<Q", np.uint64), 11: ("<q", np.int64), 12: ("<d", np.float64),
}
_STRING, _ARRAY = 8, 9


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
    """Sequential little-endian reads that turn running off the end into a clear error."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> int:
        start = self.pos
        self.pos += n
        if self.pos > len(self.buf):
            raise EdgeInferError(f"{self.path}: truncated GGUF file (header ends early)")
        return start

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        return struct.unpack_from(fmt, self.buf, self.take(size))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        start = self.take(n)
        return bytes(self.buf[start : start + n]).decode("utf-8", errors="surrogateescape")

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array()
        if vtype not in _SCALAR:
            raise EdgeInferError(f"{self.path}: corrupt GGUF metadata (value type {vtype})")
        return self.scalar(_SCALAR[vtype][0])

    def array(self) -> Any:
        etype, count = self.scalar("<I"), self.scalar("<Q")
        if etype == _STRING:
            return self._string_array(count)
        if etype == _ARRAY:
            return [self.array() for _ in range(count)]
        if etype not in _SCALAR:
            raise EdgeInferError(f"{self.path}: corrupt GGUF metadata (array type {etype})")
        dtype = np.dtype(_SCALAR[etype][1])
        start = self.take(count * dtype.itemsize)
        return np.frombuffer(self.buf, dtype=dtype, count=count, offset=start).copy()

    def _string_array(self, count: int) -> list[str]:
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
            raise EdgeInferError(f"{self.path}: truncated GGUF file (header ends early)")
        return out


class GGUFFile:
    """An open GGUF file: `metadata` (dict), `tensors` (name -> TensorInfo), `tensor(name)`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._map = _open_map(self.path)
        cur = _Cursor(self._map, self.path)
        if len(self._map) < 4 or bytes(self._map[:4]) != b"GGUF":
            raise EdgeInferError(f"{self.path}: not a GGUF file (bad magic)")
        cur.take(4)
        self.version = cur.scalar("<I")
        if self.version not in SUPPORTED_VERSIONS:
            raise EdgeInferError(
                f"{self.path}: unsupported GGUF version {self.version} (supported: 2, 3)"
            )
        n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.scalar("<I"))
        infos = [_read_tensor_info(cur) for _ in range(n_tensors)]
        align = int(self.metadata.get("general.alignment", 32))
        self.data_offset = -(-cur.pos // align) * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, dims, qtype, rel in infos:
            info = _tensor_info(name, dims, qtype, self.data_offset + rel)
            if info.offset + info.n_bytes > len(self._map):
                raise EdgeInferError(
                    f"{self.path}: truncated GGUF file (tensor '{name}' runs past the end)"
                )
            self.tensors[name] = info
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


def _release_pages(buf: mmap.mmap, end: int) -> None:
    """Unmap the resident pages of the header [0, end) from this process: it was read once,
    into Python objects (a 262k-token vocabulary's strings and scores are 6 MB of the file).
    The page cache keeps them; a later read would map them again."""
    n = end // mmap.PAGESIZE * mmap.PAGESIZE
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


def _read_tensor_info(cur: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    name = cur.string()
    n_dims = cur.scalar("<I")
    if n_dims > 8:
        raise EdgeInferError(f"{cur.path}: corrupt tensor info for '{name}' ({n_dims} dims)")
    dims = tuple(cur.scalar("<Q") for _ in range(n_dims))
    return name, dims, cur.scalar("<I"), cur.scalar("<Q")


def _tensor_info(name: str, dims: tuple[int, ...], qtype: int, offset: int) -> TensorInfo:
    shape = tuple(reversed(dims))  # GGML lists dims innermost first
    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    except (ValueError, KeyError):
        # Unknown type: size unknown, reported later by the model builder with the tensor name.
        return TensorInfo(name, qtype, shape, offset, 0)
    n_elem = int(np.prod(dims)) if dims else 1
    return TensorInfo(name, qtype, shape, offset, n_elem // block * type_size)
