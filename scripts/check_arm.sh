#!/usr/bin/env bash
# The AArch64 kernels, run for real in an emulated arm64 Debian root (qemu-user-static):
#
#   sudo bash scripts/check_arm.sh [quick|full]
#
# Builds the root once with debootstrap (reused from ARM_ROOT, default
# ~/.cache/edgeinfer/arm64-root), installs Python and the package's aarch64 wheels in a venv
# inside it, copies this tree in, and runs there, for both AArch64 paths: numba's target
# variables pick the path (cortex-a76 with dotprod, sdot; cortex-a72 without, NEON widening
# multiplies) and QEMU_CPU emulates that very CPU, so an instruction it lacks traps (qemu's
# default `max` has every extension); bookworm's qemu 7.2 models both CPUs by these names:
#   quick: the legacy and k-quant kernel tests against their references on small shapes on
#          both paths, the tiny-model forward against the float64 reference on the dotprod
#          path; then `edgeinfer run` on SmolLM2 (greedy) on both paths, whose text must equal
#          x86's portable path's (NUMBA_CPU_NAME=generic here: the same bits by construction);
#   full:  every kernel and model test on both paths, then SmolLM2 as in quick.
# The two paths run side by side (numba compiles on one core under emulation).
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
[ "$(id -u)" = 0 ] || { say "needs root (debootstrap, chroot, mounts): sudo bash $0 $MODE"; exit 1; }

# -- the emulator and the root -----------------------------------------------------------------
if ! command -v debootstrap >/dev/null || [ ! -e /usr/bin/qemu-aarch64-static ]; then
    say "installing debootstrap and qemu-user-static"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q debootstrap qemu-user-static binfmt-support >/dev/null 2>&1 || {
        apt-get update -q >/dev/null
        apt-get install -y -q debootstrap qemu-user-static binfmt-support >/dev/null
    }
fi
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
if [ ! -x "$ROOT/usr/bin/python3" ] || [ ! -e "$ROOT/.edgeinfer-root-done" ]; then
    say "building the arm64 root in $ROOT (debootstrap under emulation: minutes)"
    rm -rf "$ROOT"
    mkdir -p "$ROOT"
    for try in 1 2; do  # a mirror's hiccup: once more from scratch
        debootstrap --arch=arm64 --variant=minbase \
            --include=python3,python3-venv,ca-certificates bookworm "$ROOT" "$MIRROR" >&2 \
            && break
        [ "$try" = 2 ] && { say "debootstrap failed twice"; exit 1; }
        rm -rf "$ROOT" && mkdir -p "$ROOT"
    done
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
declare -A FEATURES=([cortex-a76]="+neon,+dotprod" [cortex-a72]="+neon")
declare -A HWCAP_DOTPROD=([cortex-a76]=1 [cortex-a72]=0)  # HWCAP_ASIMDDP, bit 20
on_target() {  # on_target CPU COMMAND...: in the root, on CPU, numba compiling for it
    local cpu=$1
    shift
    in_root QEMU_CPU="$cpu" NUMBA_CPU_NAME="$cpu" NUMBA_CPU_FEATURES="${FEATURES[$cpu]}" \
        NUMBA_CACHE_DIR="/root/numba-cache-$cpu" "$@"
}
KERNEL_FILES="tests/test_kernels_legacy.py tests/test_kernels_kquants.py"
declare -A SUBSET FILES=([cortex-a76]="$KERNEL_FILES tests/test_model.py")
if [ "$MODE" = full ]; then
    SUBSET=([cortex-a76]="not slow and not real" [cortex-a72]="not slow and not real")
    FILES[cortex-a72]="$KERNEL_FILES tests/test_model.py"
    MAY_SKIP=1  # x86 targets' tests skip here
else
    # small shapes: legacy products (every n_tok, so the serial and the threaded row loops),
    # k-quant products over two super-blocks and the Q8_K quantizer, all against their
    # references; the forwards on the dotprod path, read-only weights (a second compile of
    # every legacy kernel) on the other, which balances the two runs' compile time
    KERNELS="(vs_dequantized and (7x96 or 16x576)) or arbitrary or \
(dequantized_reference and -512-) or q8_k or zero_activations"
    SUBSET=([cortex-a76]="not slow and not real and ($KERNELS or forward_matches_reference_f32 \
or every_batch_size)" [cortex-a72]="not slow and not real and ($KERNELS or outliers)")
    FILES[cortex-a72]="$KERNEL_FILES"
    MAY_SKIP=0
fi
# numba's cache knows a kernel's own file, not the IR helpers it calls from other modules:
# compile afresh, so the checks run this tree's code
rm -rf "$ROOT"/root/numba-cache-*
RC=0
SUMMARIES=()
declare -A PIDS PATHS
# the two paths at once: numba compiles on one core under emulation, and the CPU has two
for cpu in cortex-a76 cortex-a72; do
    hwcap=$(on_target "$cpu" python -c \
        "import ctypes; print(ctypes.CDLL(None).getauxval(16) >> 20 & 1)")
    PATHS[$cpu]=$(on_target "$cpu" python -c \
        "from edgeinfer.kernels.isa import ISA; print(ISA.NAME)")
    say "tests under emulation, $cpu (asimddp $hwcap): the ${PATHS[$cpu]} path"
    [ "$hwcap" = "${HWCAP_DOTPROD[$cpu]}" ] || { say "QEMU_CPU=$cpu not in effect"; RC=1; }
    rm -f "$ROOT/tmp/junit-$cpu.xml"
    on_target "$cpu" sh -c "cd /src && python -m pytest -q -rs -p no:cacheprovider \
        --junitxml=/tmp/junit-$cpu.xml ${FILES[$cpu]} -k '${SUBSET[$cpu]}'" \
        > "/tmp/check_arm_pytest_$cpu.log" 2>&1 &
    PIDS[$cpu]=$!
done
for cpu in cortex-a76 cortex-a72; do
    wait "${PIDS[$cpu]}" || RC=1
    tail -3 "/tmp/check_arm_pytest_$cpu.log" >&2
    # each file's tests ran (a -k that matches none of a file's names fails here) and none
    # skipped in quick (a skip there is a path not checked)
    python3 - "$ROOT/tmp/junit-$cpu.xml" "$MAY_SKIP" ${FILES[$cpu]} <<'PY' >&2 || RC=1
import sys, xml.etree.ElementTree as ET
cases = list(ET.parse(sys.argv[1]).iter("testcase"))
bad = [f"{f}: no test ran" for f in sys.argv[3:]
       if not any(c.get("classname") == f[:-3].replace("/", ".") for c in cases)]
bad += [f"skipped: {c.get('name')}" for c in cases
        if c.find("skipped") is not None and sys.argv[2] == "0"]
for b in bad:
    print("check_arm:", b)
sys.exit(1 if bad else 0)
PY
    SUMMARIES+=("$cpu (${PATHS[$cpu]}): $(tail -1 "/tmp/check_arm_pytest_$cpu.log")")
done
T_TESTS=$(date +%s)
SAME=null
if [ -e "$MODELS/$SMOLLM2" ]; then
    want=$(cd "$REPO" && NUMBA_CPU_NAME=generic NUMBA_CPU_FEATURES= \
        NUMBA_CACHE_DIR=$HOME/.cache/edgeinfer/numba-generic python -m edgeinfer.cli run \
        "$MODELS/$SMOLLM2" -p "$PROMPT" -n 32 --temp 0 --local 2>/dev/null)
    say "x86, portable path: $want"
    SAME=true
    for cpu in cortex-a76 cortex-a72; do
        on_target "$cpu" python -m edgeinfer.cli run "/root/.cache/edgeinfer/models/$SMOLLM2" \
            -p "$PROMPT" -n 32 --temp 0 --local > "/tmp/check_arm_text_$cpu.txt" 2>/dev/null &
        PIDS[$cpu]=$!
    done
    for cpu in cortex-a76 cortex-a72; do
        wait "${PIDS[$cpu]}" || { SAME=false; RC=1; }
        got=$(cat "/tmp/check_arm_text_$cpu.txt")
        say "arm64 $cpu: $got"
        [ "$want" = "$got" ] || { SAME=false; RC=1; }
    done
fi
SUMMARY=$(IFS=';'; echo "${SUMMARIES[*]}")
T_END=$(date +%s)
printf '{"mode": "%s", "pytest": "%s", "rc": %d, "same_text_as_x86": %s, "root_s": %d, "setup_s": %d, "tests_s": %d, "run_s": %d, "total_s": %d}\n' \
    "$MODE" "$SUMMARY" "$RC" "$SAME" $((T_ROOT - T0)) $((T_SETUP - T_ROOT)) \
    $((T_TESTS - T_SETUP)) $((T_END - T_TESTS)) $((T_END - T0))
exit "$RC"
