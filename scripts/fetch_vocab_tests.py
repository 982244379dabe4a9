"""Fetch llama.cpp's conformance data for the tokenizer and chat tests.

The PyPI sdist of llama-cpp-python vendors llama.cpp, so we take the files from there with
pip; nothing is built. Three sets land under `$XDG_CACHE_HOME/edgeinfer` (default
`~/.cache/edgeinfer`):

* `vocab-tests/`: `models/ggml-vocab-*.gguf` with `.inp` (inputs separated by a
  `__ggml_vocab_test__` line) and `.out` (the ids, one line per input), for
  tests/test_tokenizer_vocabs.py;
* `templates/`: `models/templates/*.jinja`, the real chat templates llama-server's tests use,
  for tests/test_chat_*.py;
* `llama-refs/`: the llama.cpp sources whose expected values the chat tests read
  (tests/test-chat-template.cpp, tests/test-chat.cpp, tests/test-chat-auto-parser.cpp,
  src/llama-chat.cpp);
* `grammars/`: `grammars/*.gbnf`, llama.cpp's example GBNF grammars, for
  tests/test_structured.py.

Each set has its own marker file; running again once all are there does nothing.

    python scripts/fetch_vocab_tests.py [--dest DIR] [--templates-dest DIR] [--refs-dest DIR]
                                        [--grammars-dest DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

PACKAGE = "llama-cpp-python==0.3.36"
ROOT = "vendor/llama.cpp/"
MARKER = ".fetched"
REF_FILES = ("tests/test-chat-template.cpp", "tests/test-chat.cpp",
             "tests/test-chat-auto-parser.cpp", "src/llama-chat.cpp")


def _vocab(path: str) -> bool:
    return path.startswith("models/") and path.rsplit("/", 1)[-1].startswith("ggml-vocab-")


def _template(path: str) -> bool:
    return path.startswith("models/templates/") and path.endswith(".jinja")


def _reference(path: str) -> bool:
    return path in REF_FILES


def _grammar(path: str) -> bool:
    return path.startswith("grammars/") and path.endswith(".gbnf")


# (option, default directory under the cache, which llama.cpp paths go there)
TARGETS: tuple[tuple[str, str, Callable[[str], bool]], ...] = (
    ("dest", "vocab-tests", _vocab),
    ("templates_dest", "templates", _template),
    ("refs_dest", "llama-refs", _reference),
    ("grammars_dest", "grammars", _grammar),
)


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgeinfer"


def default_dest() -> Path:
    return cache_root() / "vocab-tests"


def download_sdist(workdir: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    subprocess.run([*cmd, PACKAGE, "-d", str(workdir)], check=True)
    sdists = sorted(workdir.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        raise SystemExit(f"pip download left no sdist in {workdir}")
    return sdists[0]


def _llama_path(member: tarfile.TarInfo) -> str | None:
    """The member's path inside vendor/llama.cpp/, or None outside it."""
    inner = member.name.split("/", 1)[-1]
    return inner[len(ROOT):] if inner.startswith(ROOT) else None


def extract(sdist: Path, wanted: Callable[[str], bool], dest: Path) -> list[str]:
    """Copy the regular files under vendor/llama.cpp/ that `wanted` accepts, flattened into
    dest (their base names are unique within each set)."""
    dest.mkdir(parents=True, exist_ok=True)
    names = []
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            path = _llama_path(member)
            if not (member.isfile() and path is not None and wanted(path)):
                continue
            base = path.rsplit("/", 1)[-1]
            tmp = dest / f".{base}.part"
            tmp.write_bytes(tar.extractfile(member).read())
            tmp.replace(dest / base)
            names.append(base)
    return sorted(names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for option, subdir, _ in TARGETS:
        parser.add_argument("--" + option.replace("_", "-"), type=Path,
                            default=cache_root() / subdir)
    args = parser.parse_args()
    missing = [(getattr(args, option), wanted) for option, _, wanted in TARGETS
               if not (getattr(args, option) / MARKER).exists()]
    if not missing:
        print("already fetched: " + ", ".join(str(getattr(args, t[0])) for t in TARGETS))
        return
    with tempfile.TemporaryDirectory() as workdir:
        sdist = download_sdist(Path(workdir))
        for dest, wanted in missing:
            names = extract(sdist, wanted, dest)
            if not names:
                raise SystemExit(f"nothing for {dest.name} found in the {PACKAGE} sdist")
            (dest / MARKER).write_text(f"{PACKAGE}\n" + "\n".join(names) + "\n")
            print(f"{len(names)} files in {dest}")


if __name__ == "__main__":
    main()
