"""Fetch llama.cpp's tokenizer conformance data for tests/test_tokenizer_vocabs.py.

llama.cpp ships vocab-only GGUF files with test pairs, `models/ggml-vocab-*.gguf` plus `.inp`
(inputs separated by a `__ggml_vocab_test__` line) and `.out` (the ids, one line per input).
The PyPI sdist of llama-cpp-python vendors them, so we take them from there with pip; nothing
is built. Files land in `$XDG_CACHE_HOME/edgeinfer/vocab-tests` (default
`~/.cache/edgeinfer/vocab-tests`). Running it again once they are there does nothing.

    python scripts/fetch_vocab_tests.py [--dest DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "llama-cpp-python==0.3.36"
MEMBER_DIR = "vendor/llama.cpp/models/"
MEMBER_PREFIX = "ggml-vocab-"
MARKER = ".fetched"


def default_dest() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgeinfer" / "vocab-tests"


def download_sdist(workdir: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    subprocess.run([*cmd, PACKAGE, "-d", str(workdir)], check=True)
    sdists = sorted(workdir.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        raise SystemExit(f"pip download left no sdist in {workdir}")
    return sdists[0]


def extract_vocabs(sdist: Path, dest: Path) -> list[str]:
    """Copy only `vendor/llama.cpp/models/ggml-vocab-*` regular files, flattened into dest."""
    dest.mkdir(parents=True, exist_ok=True)
    names = []
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            base = member.name.rsplit("/", 1)[-1]
            in_models = member.name.split("/", 1)[-1].startswith(MEMBER_DIR)
            if not (member.isfile() and in_models and base.startswith(MEMBER_PREFIX)):
                continue
            source = tar.extractfile(member)
            tmp = dest / f".{base}.part"
            tmp.write_bytes(source.read())
            tmp.replace(dest / base)
            names.append(base)
    return sorted(names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=default_dest())
    args = parser.parse_args()
    dest: Path = args.dest
    if (dest / MARKER).exists():
        print(f"already fetched: {dest}")
        return
    with tempfile.TemporaryDirectory() as workdir:
        names = extract_vocabs(download_sdist(Path(workdir)), dest)
    if not names:
        raise SystemExit(f"no {MEMBER_PREFIX}* files found in the {PACKAGE} sdist")
    (dest / MARKER).write_text(f"{PACKAGE}\n" + "\n".join(names) + "\n")
    print(f"{len(names)} files in {dest}")


if __name__ == "__main__":
    main()
