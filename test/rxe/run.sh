#!/usr/bin/env bash
# Run a payload inside a QEMU/TCG guest with two Soft-RoCE devices
# (rxe0/veth0 192.0.2.1 <-> rxe1/veth1 192.0.2.2). See test/rxe/README.md.
#
#   test/rxe/run.sh [options]
#     --payload SCRIPT  bash script run in the guest (default test/rxe/payload.sh:
#                       every test in test/rxe/tests.d/)
#     --cmd "CMD"       run CMD with bash -c instead of a payload
#     --tests "GLOBS"   with the default payload: run only these tests (RXE_TESTS)
#     --timeout SEC     wall-clock limit for the whole VM run (default 1200)
#     --mtu N           veth MTU (default 9000; rxe active_mtu 4096)
#     --smp N           guest vCPUs (default 2)
#     --mem MB          guest memory (default 2048)
#     --cpu MODEL       QEMU CPU model (default qemu64; use max for -march=native binaries)
#     --topo T          guest topology (default veth, or RXE_TOPO): veth = rxe0/rxe1
#                       on one veth pair; bridge = rxe0..rxe3 on four veth pairs
#                       whose outer ends join br0 (one device can fail alone);
#                       --env RXE_TOPO=T does the same
#     --env NAME=VALUE  export NAME in the guest (repeatable); NCCL_* and
#                       RXE_TEST* variables of the caller are forwarded as is
#     --out DIR         job directory (default build/rxe-runs/<time>-<pid>);
#                       RXE_OUT is DIR/out, the console log DIR/console.log
#
# Exit status: the payload's; 124 if the run timed out; 125 if the guest gave
# no status (boot failure, panic) or the harness failed to set up the guest.
#
# Environment: RXE_CACHE (kernel and initramfs cache, default build/rxe-cache),
# RXE_KERNEL_PKG (see setup.sh), RXE_RUNS (parent of job directories),
# RXE_APPEND (extra kernel arguments), RXE_BOOT=bzimage (no PVH boot).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd -P)
CACHE=${RXE_CACHE:-$REPO/build/rxe-cache}
RUNS=${RXE_RUNS:-$REPO/build/rxe-runs}
LOCK=/tmp/rxe.lock

PAYLOAD=$HERE/payload.sh
CMD=
TESTS=${RXE_TESTS:-}
TIMEOUT=${RXE_TIMEOUT:-1200}
MTU=${RXE_MTU:-9000}
SMP=${RXE_SMP:-2}
MEM=${RXE_MEM:-2048}
CPU=${RXE_CPU:-qemu64}
TOPO=${RXE_TOPO:-veth}
JOB=
ENVS=()

say() { printf 'rxe-run: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 125; }
usage() { sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//;/^set -e/d'; }

while [ $# -gt 0 ]; do
    opt=$1
    case $opt in
    --*=*) set -- "${opt%%=*}" "${opt#*=}" "${@:2}"; continue ;;
    -h | --help) usage; exit 0 ;;
    --payload | --cmd | --tests | --timeout | --mtu | --smp | --mem | --cpu | --topo | --env | --out)
        [ $# -ge 2 ] || die "$opt needs a value"
        case $opt in
        --payload) PAYLOAD=$2 ;;
        --cmd) CMD=$2 ;;
        --tests) TESTS=$2 ;;
        --timeout) TIMEOUT=$2 ;;
        --mtu) MTU=$2 ;;
        --smp) SMP=$2 ;;
        --mem) MEM=$2 ;;
        --cpu) CPU=$2 ;;
        --topo) TOPO=$2 ;;
        --env) ENVS+=("$2"); [[ $2 == RXE_TOPO=* ]] && TOPO=${2#RXE_TOPO=} ;;
        --out) JOB=$2 ;;
        esac
        shift 2
        ;;
    *) usage >&2; die "unknown argument: $opt" ;;
    esac
done
for n in TIMEOUT MTU SMP MEM; do
    [[ ${!n} =~ ^[1-9][0-9]*$ ]] || die "--${n,,} must be a positive integer (got '${!n}')"
done
[ "$MTU" -ge 1280 ] && [ "$MTU" -le 65535 ] || die "--mtu must be 1280..65535"
if [ -z "$CMD" ]; then
    [ -f "$PAYLOAD" ] || die "payload $PAYLOAD not found"
    PAYLOAD=$(realpath "$PAYLOAD")
fi
case $TOPO in veth | bridge) ;; *) die "--topo must be veth or bridge (got '$TOPO')" ;; esac
for e in ${ENVS[@]+"${ENVS[@]}"}; do
    [[ $e =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env wants NAME=VALUE (got '$e')"
done

T0=$SECONDS
step() { say "$1 ($((SECONDS - T0))s)"; }

# ---- host setup: packages, kernel ---------------------------------------
"$HERE/setup.sh"
# shellcheck disable=SC1091
. "$CACHE/kernel.env"
step "kernel $RXE_KVER ($RXE_KPKG)"

# ---- initramfs, cached on a content hash ---------------------------------
key=$( {
    echo "$RXE_KPKG $RXE_KVER"
    sha256sum "$HERE/mkinitramfs.sh" "$HERE/init" /bin/busybox | cut -d' ' -f1
} | sha256sum | cut -c1-16)
INITRD=$CACHE/initramfs-$key.cpio
ensure_initrd() {
    [ -e "$INITRD" ] && return 0
    (
        flock 8
        if [ ! -e "$INITRD" ]; then
            "$HERE/mkinitramfs.sh" "$RXE_KROOT" "$RXE_KVER" "$INITRD"
            # keep the 4 newest; a waiting run rebuilds its own if it was pruned
            ls -1t "$CACHE"/initramfs-*.cpio | tail -n +5 | xargs -r rm -f
        fi
    ) 8>"$CACHE/.setup.lock"
    step "initramfs built: $INITRD"
}
ensure_initrd

# ---- job directory: config for the guest, RXE_OUT ------------------------
if [ -z "$JOB" ]; then
    JOB=$RUNS/$(date +%Y%m%d-%H%M%S)-$$
    mkdir -p "$RUNS"
    # keep the 20 newest runs
    ls -1d "$RUNS"/[0-9]*-[0-9]* 2>/dev/null | sort | head -n -20 | while read -r old; do
        rm -rf "$old"
    done || true
    ln -sfn "${JOB##*/}" "$RUNS/latest"
fi
mkdir -p "$JOB"
JOB=$(cd "$JOB" && pwd -P)
rm -rf "$JOB/out" "$JOB/exit-status" "$JOB/console.log" "$JOB/env" "$JOB/config"
mkdir -p "$JOB/out"

q() { local s=${1//\'/\'\\\'\'}; printf "'%s'" "$s"; }
# Paths that the guest's tmpfs /tmp, /run, /var/tmp would hide.
EXPOSE=$REPO
[ -z "$CMD" ] && EXPOSE+=" $(dirname "$PAYLOAD")"
for p in $EXPOSE; do
    [[ $p =~ [[:space:]] ]] && die "path with spaces is not supported: $p"
done
{
    echo "RXE_REPO=$(q "$REPO")"
    echo "RXE_JOB=$(q "$JOB")"
    echo "RXE_OUT=$(q "$JOB/out")"
    echo "RXE_MTU=$(q "$MTU")"
    echo "RXE_TOPO=$(q "$TOPO")"
    echo "RXE_PAYLOAD=$(q "$PAYLOAD")"
    echo "RXE_CMD=$(q "$CMD")"
    echo "RXE_EXPOSE=$(q "$EXPOSE")"
} >"$JOB/config"
{
    [ -n "$TESTS" ] && echo "RXE_TESTS=$(q "$TESTS")"
    while IFS= read -r name; do
        echo "$name=$(q "${!name}")"
    done < <(compgen -e | grep -E '^(NCCL_|RXE_TEST_)' || true)
    for e in ${ENVS[@]+"${ENVS[@]}"}; do
        echo "${e%%=*}=$(q "${e#*=}")"
    done
} >"$JOB/env"

# ---- one VM at a time on this machine ------------------------------------
exec 9>"$LOCK"
TWAIT=$SECONDS
if ! flock -n 9; then
    say "waiting for $LOCK (another rxe VM is running)"
    flock 9
fi
TWAIT=$((SECONDS - TWAIT))
ensure_initrd

QPID=
cleanup() {
    if [ -n "$QPID" ] && kill -0 "$QPID" 2>/dev/null; then
        say "stopping QEMU"
        kill -TERM -- "-$QPID" 2>/dev/null || kill -TERM "$QPID" 2>/dev/null || true
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            kill -0 "$QPID" 2>/dev/null || break
            sleep 0.5
        done
        kill -KILL -- "-$QPID" 2>/dev/null || true
        wait "$QPID" 2>/dev/null || true
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

# PVH boot of the extracted vmlinux skips SeaBIOS and the decompression.
KERNEL=$RXE_VMLINUZ
[ -n "${RXE_VMLINUX:-}" ] && [ "${RXE_BOOT:-pvh}" = pvh ] && KERNEL=$RXE_VMLINUX
# tsc=reliable: the guest otherwise finds the emulated TSCs "unsynchronized"
# and falls back to HPET, and every clock_gettime() becomes a syscall plus an
# emulated MMIO read (~1 us instead of ~0.1 us). QEMU's TCG TSC is one
# host-derived counter for all vCPUs, so it is safe. RXE_KERNEL_ARGS replaces
# it, RXE_APPEND adds more.
APPEND="console=ttyS0 quiet loglevel=4 panic=-1 mitigations=off ${RXE_KERNEL_ARGS-tsc=reliable} ${RXE_APPEND:-}"
qemu=(
    qemu-system-x86_64 -name rxe-vm
    -accel tcg,thread=multi -smp "$SMP" -m "$MEM" -cpu "$CPU"
    -nodefaults -no-user-config -display none -no-reboot
    -kernel "$KERNEL" -initrd "$INITRD" -append "$APPEND"
    -chardev "stdio,id=con0,signal=off,logfile=$JOB/console.log"
    -serial chardev:con0
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap
    -virtfs "local,path=$JOB,mount_tag=rxejob,security_model=none,multidevs=remap"
)
step "booting $RXE_KVER (smp $SMP, cpu $CPU, mtu $MTU, topo $TOPO, timeout ${TIMEOUT}s); job $JOB"
TBOOT=$SECONDS
# timeout runs QEMU in its own process group; cleanup() kills that group.
timeout -k 10 "$TIMEOUT" "${qemu[@]}" </dev/null &
QPID=$!
qrc=0
wait "$QPID" || qrc=$?
QPID=
echo

rc=
if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
    say "timed out after ${TIMEOUT}s"
    rc=124
elif [ -s "$JOB/exit-status" ]; then
    rc=$(tr -dc '0-9' <"$JOB/exit-status")
fi
if [ -z "$rc" ]; then
    rc=$(tr -d '\r' <"$JOB/console.log" 2>/dev/null | sed -n 's/^rxe-init: RXE_EXIT=\([0-9]*\).*/\1/p' | tail -n1)
fi
if [ -z "$rc" ]; then
    say "the guest gave no exit status (QEMU exit $qrc); see $JOB/console.log"
    rc=125
fi
say "exit $rc; VM $((SECONDS - TBOOT))s, lock wait ${TWAIT}s, total $((SECONDS - T0))s; console $JOB/console.log; RXE_OUT $JOB/out"
exit "$rc"
