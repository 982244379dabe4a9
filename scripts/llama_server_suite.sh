#!/usr/bin/env bash
# Run llama.cpp's own server test suite (llama-cpp-python 0.3.36's vendor/llama.cpp/tools/
# server/tests) offline against a llama-server compatible binary, and write its outcomes.
#
# Usage: scripts/llama_server_suite.sh SERVER_BIN [PYTEST_ARGS...]
#   SERVER_BIN     llama-server, or $(which edgeinfer-server); becomes LLAMA_SERVER_BIN_PATH
#   PYTEST_ARGS    default: unit -m "not slow"; e.g. unit/test_tokenize.py -k detokenize
#
# Environment (all optional):
#   LLAMA_SDIST_DIR  an unpacked llama_cpp_python-0.3.36 sdist to reuse; otherwise it is
#                    fetched with pip into ~/.cache/edgeinfer/llama-sdist
#   SUITE_MODEL      the GGUF the local presets serve (default: the SmolLM2 file that
#                    scripts/fetch_models.py fetches; fetched here when missing)
#   SUITE_JSON       where the outcomes go (default: ./llama-server-suite.json)
#   SUITE_SCRATCH    where the suite is copied (default: a new temporary directory)
#   SUITE_WORKERS    pytest-xdist workers (default 1; each worker's servers use their own port)
#   SUITE_THREADS    threads of each server (LLAMA_ARG_THREADS for llama-server,
#                    NUMBA_NUM_THREADS for edgeinfer); on a busy machine 1, or llama-server's
#                    spinning threads can take minutes per request
#
# What "offline" means (scripts/llama_server_suite/offline.txt, read by offline_plugin.py):
# the text-generation presets serve SUITE_MODEL; tests that need any other hub model, a
# download, or the internet are skipped with the reason; no assertion is changed.
# The JSON has each test's outcome and reason, and per-file and total counts.
set -euo pipefail

VERSION=0.3.36
HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")

if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
    sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 2
fi
SERVER_BIN=$(command -v -- "$1" || true)
[ -n "$SERVER_BIN" ] || { echo "error: no such server binary: $1" >&2; exit 2; }
SERVER_BIN=$(realpath -- "$SERVER_BIN")
shift
[ $# -gt 0 ] || set -- unit -m "not slow"

fetch_sdist() {
    local cache="$HOME/.cache/edgeinfer/llama-sdist"
    local dir="$cache/llama_cpp_python-$VERSION"
    if [ ! -d "$dir/vendor/llama.cpp/tools/server/tests" ]; then
        mkdir -p "$cache"
        python -m pip download --quiet --no-deps --no-binary :all: -d "$cache" \
            "llama-cpp-python==$VERSION" >&2
        tar -xzf "$cache/llama_cpp_python-$VERSION.tar.gz" -C "$cache"
    fi
    echo "$dir"
}

SDIST=${LLAMA_SDIST_DIR:-$(fetch_sdist)}
LLAMA=$SDIST/vendor/llama.cpp
[ -d "$LLAMA/tools/server/tests/unit" ] || { echo "error: no server tests in $LLAMA" >&2; exit 1; }

MODEL=${SUITE_MODEL:-$HOME/.cache/edgeinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ ! -f "$MODEL" ] && [ -z "${SUITE_MODEL:-}" ]; then
    python "$REPO/scripts/fetch_models.py" smollm2 >&2
fi
[ -f "$MODEL" ] || { echo "error: no model file $MODEL" >&2; exit 1; }

# The copy keeps the tests' relative paths: ../../../models/templates, ../../../tools/mtmd.
SCRATCH=${SUITE_SCRATCH:-$(mktemp -d -t llama-server-suite.XXXXXX)}
rm -rf "$SCRATCH/tools/server/tests"
mkdir -p "$SCRATCH/tools/server"
cp -r "$LLAMA/tools/server/tests" "$SCRATCH/tools/server/tests"
ln -sfn "$LLAMA/models" "$SCRATCH/models"
ln -sfn "$LLAMA/tools/mtmd" "$SCRATCH/tools/mtmd"

# Install the suite's requirements that are missing, unpinned: its pins (numpy~=2.2.6 ...)
# would downgrade what the project itself runs on.
python - "$SCRATCH/tools/server/tests/requirements.txt" <<'EOF'
import re, subprocess, sys
from importlib.metadata import PackageNotFoundError, version
missing = []
for line in open(sys.argv[1]):
    name = re.split(r"[~=<>!\[; ]", line.strip(), maxsplit=1)[0]
    if not name or name.startswith("#"):
        continue
    try:
        version(name)
    except PackageNotFoundError:
        missing.append(name)
if missing:
    print("installing the suite's requirements:", *missing, file=sys.stderr)
    subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", *missing])
EOF

OUT=$(realpath -m -- "${SUITE_JSON:-llama-server-suite.json}")
WORKERS=${SUITE_WORKERS:-1}
if [ -n "${SUITE_THREADS:-}" ]; then
    export LLAMA_ARG_THREADS=$SUITE_THREADS NUMBA_NUM_THREADS=$SUITE_THREADS
fi
XDIST=()
[ "$WORKERS" -le 1 ] || XDIST=(-n "$WORKERS" --dist=worksteal)

echo "suite: $SCRATCH/tools/server/tests, server $SERVER_BIN, model $MODEL" >&2
cd "$SCRATCH/tools/server/tests"
rc=0
LLAMA_SERVER_BIN_PATH=$SERVER_BIN SUITE_MODEL=$MODEL SUITE_JSON=$OUT \
PYTHONPATH="$HERE/llama_server_suite${PYTHONPATH:+:$PYTHONPATH}" \
    python -m pytest -p offline_plugin -p no:cacheprovider -q -rN --tb=short "${XDIST[@]}" "$@" || rc=$?
[ -f "$OUT" ] || { echo "error: pytest exited $rc without writing $OUT" >&2; exit "$rc"; }
python - "$OUT" <<'EOF'
import json, sys
result = json.load(open(sys.argv[1]))
for name, counts in result["files"].items():
    print(f"{name:40} " + " ".join(f"{k}={v:<3}" for k, v in counts.items()))
print(f"{'total':40} " + " ".join(f"{k}={v:<3}" for k, v in result["totals"].items()))
print(f"outcomes: {sys.argv[1]}")
EOF
# pytest's 1 means "some tests failed", the expected result; anything else is a broken run.
[ "$rc" -le 1 ] || exit "$rc"
