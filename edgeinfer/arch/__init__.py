"""Architectures registered by GGUF name: each is a config hook plus the tensors it needs.

Adding one is one file in this package that calls `register`; the loader and the forward pass
read only the `ModelConfig` it builds and the tensors present in the file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgeinfer.config import ModelConfig
from edgeinfer.errors import EdgeInferError, printable


@dataclass(frozen=True)
class Arch:
    name: str
    config_from_gguf: Callable[[dict[str, Any]], ModelConfig]
    block_tensors: tuple[str, ...]  # per-block tensors the family requires, GGUF names


ARCHES: dict[str, Arch] = {}


def register(arch: Arch) -> Arch:
    ARCHES[arch.name] = arch
    return arch


def get_arch(name: str) -> Arch:
    _load_all()
    if not isinstance(name, str) or name not in ARCHES:
        supported = ", ".join(sorted(ARCHES))
        raise EdgeInferError(
            f"unsupported architecture '{printable(name, 40)}' (supported: {supported})")
    return ARCHES[name]


def _load_all() -> None:
    from edgeinfer.arch import gemma3, llama, phi3, qwen2, qwen3  # noqa: F401
