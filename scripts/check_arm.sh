#!/usr/bin/env bash
# The AArch64 kernels, run for real in an emulated arm64 Debian root (qemu-user-static):
#
#   sudo bash scripts/check_arm.sh [quick|full]
#
# Builds the root once with debootstrap (reused from ARM_ROOT, default
# ~/.cache/edgeinfer/arm64-root), installs Python and the package's aarch64 wheels in a venv
# inside it, copies this tree in, and runs there:
#   quick: the legacy and k-quant kernel tests against their references, on small shapes,
#          and the tiny-model forward against the float64 reference (what CI runs);
#   full:  quick, then `edgeinfer run` on SmolLM2 (greedy), whose text must equal this
#          host's (x86) text for the same prompt.
# Prints one JSON line of timings and counts at the end. Needs root (debootstrap, chroot,
# mounts) and binfmt_misc, which these machines have.
set -euo pipefail

MODE=${1:-quick}
REPO=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${ARM_ROOT:-$HOME/.cache/edgeinfer/arm64-root}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
MODELS=$HOME/.cache/edgeinfer/models
SMOLLM2=SmolLM2-135M-Instruct.Q4_1.gguf
PROMPT="Name three colours of the rainbow."
T0=$(date +%s)
say() { echo "check_arm: $*" >&2; }

# -- the emulator and the root -----------------------------------------------------------------
if ! command -v debootstrap >/dev/null || [ ! -e /usr/bin/qemu-aarch64-static ]; then
    say "installing debootstrap and qemu-user-static"
    apt-get install -y -q debootstrap qemu-user-static binfmt-support >/dev/null
fi
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
if [ ! -x "$ROOT/usr/bin/python3" ] || [ ! -e "$ROOT/.edgeinfer-root-done" ]; then
    say "building the arm64 root in $ROOT (debootstrap under emulation: minutes)"
    rm -rf "$ROOT"
    mkdir -p "$ROOT"
    debootstrap --arch=arm64 --variant=minbase \
        --include=python3,python3-venv,ca-certificates bookworm "$ROOT" "$MIRROR" >&2
    touch "$ROOT/.edgeinfer-root-done"
fi
T_ROOT=$(date +%s)

# -- mounts, undone on exit -------------------------------------------------------------------
mounted=()
cleanup() {
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" || true; done
}
trap cleanup EXIT
bind() {  # bind SRC (a directory) at ROOT/DST
    mkdir -p "$ROOT$2"
    mount --bind "$1" "$ROOT$2"
    mounted+=("$ROOT$2")
}
mount -t proc proc "$ROOT/proc" && mounted+=("$ROOT/proc")
bind /dev /dev
bind /sys /sys
[ -d "$MODELS" ] && bind "$MODELS" /root/.cache/edgeinfer/models
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# this host's CA bundle (a proxy's certificate, where there is one) for pip inside
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/host-ca-bundle.crt"
in_root() {
    chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/venv/bin:/usr/bin:/bin \
        PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt PIP_DISABLE_PIP_VERSION_CHECK=1 \
        PIP_DEFAULT_TIMEOUT=180 NUMBA_CACHE_DIR=/root/numba-cache PYTHONDONTWRITEBYTECODE=1 \
        "$@"
}

# -- this tree and its wheels -------------------------------------------------------------------
rm -rf "$ROOT/src"
mkdir -p "$ROOT/src"
tar -C "$REPO" --exclude=.git --exclude='__pycache__' --exclude='*.egg-info' \
    --exclude=.venv --exclude=.pytest_cache -cf - . | tar -C "$ROOT/src" -xf -
if [ ! -x "$ROOT/venv/bin/python" ]; then
    in_root python3 -m venv /venv
fi
say "installing the package's aarch64 wheels"
in_root pip install -q -e /src pytest >&2
T_SETUP=$(date +%s)

# -- the checks ---------------------------------------------------------------------------------
say "kernel and forward tests under emulation"
in_root python -c "from edgeinfer.kernels.target import DOT_PATH, CPU_NAME, CPU_FEATURES; \
print('check_arm: target', CPU_NAME, DOT_PATH, 'dotprod' in CPU_FEATURES)" >&2
set +e
in_root sh -c "cd /src && python -m pytest -q -p no:cacheprovider \
    tests/test_kernels_legacy.py tests/test_kernels_kquants.py tests/test_model.py \
    -k 'not slow and not real'" > /tmp/check_arm_pytest.log 2>&1
RC=$?
set -e
tail -3 /tmp/check_arm_pytest.log >&2
SUMMARY=$(tail -1 /tmp/check_arm_pytest.log)
T_TESTS=$(date +%s)
SAME=null
if [ "$MODE" = full ] && [ -e "$MODELS/$SMOLLM2" ]; then
    say "edgeinfer run on SmolLM2, arm64 against this host"
    want=$(cd "$REPO" && python -m edgeinfer.cli run "$MODELS/$SMOLLM2" -p "$PROMPT" -n 32 \
        --temp 0 --local 2>/dev/null)
    got=$(in_root python -m edgeinfer.cli run "/root/.cache/edgeinfer/models/$SMOLLM2" \
        -p "$PROMPT" -n 32 --temp 0 --local 2>/dev/null)
    if [ "$want" = "$got" ]; then SAME=true; else SAME=false; RC=1; fi
    say "x86:   $want"
    say "arm64: $got"
fi
T_END=$(date +%s)
printf '{"mode": "%s", "pytest": "%s", "rc": %d, "same_text_as_x86": %s, "root_s": %d, "setup_s": %d, "tests_s": %d, "run_s": %d, "total_s": %d}\n' \
    "$MODE" "$SUMMARY" "$RC" "$SAME" $((T_ROOT - T0)) $((T_SETUP - T_ROOT)) \
    $((T_TESTS - T_SETUP)) $((T_END - T_TESTS)) $((T_END - T0))
exit "$RC"
