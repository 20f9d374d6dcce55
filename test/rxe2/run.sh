#!/usr/bin/env bash
# Two QEMU/TCG guests as two RDMA nodes: each runs its own kernel with one
# Soft-RoCE device (rxe0) on one virtio NIC, and the two NICs are joined only
# to each other, by unix datagram sockets between the two QEMU processes
# (-netdev dgram; README.md says why not stream). See test/rxe2/README.md.
#
#   test/rxe2/run.sh --cmd-a "CMD" --cmd-b "CMD" [options]
#     --cmd-a CMD       command of guest A (192.0.2.1), bash -c in the repo root
#     --cmd-b CMD       command of guest B (192.0.2.2)
#     --fault F         when a line "READY" appears in either guest's
#                       $RXE_OUT/events, wait --fault-after seconds, then:
#                       kill-a | kill-b  SIGKILL that guest's QEMU (the node dies)
#                       link-a | link-b  QEMU monitor "set_link n0 off" on that
#                                        guest's NIC (the cable is pulled)
#                       link-a:N | link-b:N  the same on NIC N (0, 1, 2 with
#                                        --nics 3: 1 carries rxe0, 2 rxe1)
#                       and time every later line of the events files
#     --fault-after SEC delay after READY (default 1)
#     --fault-down SEC  link faults: plug the cable back in (set_link on)
#                       SEC seconds after the fault (default: never)
#     --watch REGEX     with --fault: also time the lines of each guest's
#                       command output ($RXE_OUT/cmd.log) that match REGEX
#                       (bash =~, extended) and appear after the fault, as "log: <line>"
#     --nics N          1 (default): one NIC per guest carries the
#                       out-of-band traffic and rxe0. 3: NIC 0 (eth of
#                       192.0.2.N) carries only the out-of-band traffic,
#                       NIC 1 rxe0 (192.0.3.N), NIC 2 rxe1 (192.0.3.1N;
#                       192.0.4.1N with --rxe-net rails)
#     --rxe-net NET     with --nics 3: shared (default): the four rxe NICs on
#                       one segment (a QEMU hub in each guest, the two hubs
#                       joined), every device reaches every other; rails: NIC 1
#                       of A only to NIC 1 of B, NIC 2 only to NIC 2
#     --timeout SEC     wall-clock limit for each guest (default 600)
#     --mtu N           NIC MTU (default 9000; rxe active_mtu 4096)
#     --smp N           vCPUs per guest (default 1: two guests on 2 host cores)
#     --mem MB          memory per guest (default 1024)
#     --cpu MODEL       QEMU CPU model (default qemu64)
#     --env NAME=VALUE  export NAME in both guests (repeatable); NCCL_* and
#                       RXE_TEST* variables of the caller are forwarded as is
#     --out DIR         job directory (default build/rxe2-runs/<time>-<pid>)
#
# In the guests: RXE2_NAME (A or B), RXE2_IP, RXE2_PEER_IP, RXE_OUT (this
# guest's writable output directory, <job>/A/out or <job>/B/out), RXE_DEV0
# (rxe0), RXE_NETDEV0, RXE_GID_INDEX0, RXE_MTU, RXE_REPO (also the cwd);
# with --nics 3 also RXE_DEV1 (rxe1), RXE_NETDEV1, RXE_IP1, RXE_GID_INDEX1,
# RXE2_PEER_IP0/1 (the peer's rxe0/rxe1 addresses) and RXE2_OOB_IF (the
# netdev of NIC 0: NCCL_SOCKET_IFNAME="=$RXE2_OOB_IF").
#
# Exit status: the first non-zero of the guests' commands (a guest killed by
# --fault does not count); 124 if a guest hit --timeout; 125 if a guest gave
# no status (boot failure, setup failure). Fault timings go to stdout and to
# <job>/fault.txt, one line per event: "<guest> +<seconds after the fault> <line>";
# its first line "fault F at <host epoch s>" (and "link-up F at <epoch>"). Each
# guest's clock against the host's: <job>/clock.txt, "<guest> <host - guest s>",
# from files the guest wrote its $EPOCHREALTIME into over 9p and their host
# mtimes (the least of 5 samples; it errs late by one 9p write, about 1-5 ms).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RXE=$(cd "$HERE/../rxe" && pwd)
REPO=$(cd "$HERE/../.." && pwd -P)
CACHE=${RXE_CACHE:-$REPO/build/rxe-cache}
RUNS=${RXE2_RUNS:-$REPO/build/rxe2-runs}
LOCK=/tmp/rxe.lock

CMD_A= CMD_B= FAULT= FAULT_AFTER=1 FAULT_DOWN= WATCH= NICS=1 RXE_NET=shared TIMEOUT=600 MTU=9000 SMP=1 MEM=1024 CPU=qemu64 JOB=
ENVS=()

say() { printf 'rxe2: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 125; }
usage() { sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//;/^set -e/d'; }

while [ $# -gt 0 ]; do
    opt=$1
    case $opt in
    --*=*) set -- "${opt%%=*}" "${opt#*=}" "${@:2}"; continue ;;
    -h | --help) usage; exit 0 ;;
    --cmd-a | --cmd-b | --fault | --fault-after | --fault-down | --watch | --nics | --rxe-net | --timeout | --mtu | \
        --smp | --mem | --cpu | --env | --out)
        [ $# -ge 2 ] || die "$opt needs a value"
        case $opt in
        --cmd-a) CMD_A=$2 ;;
        --cmd-b) CMD_B=$2 ;;
        --fault) FAULT=$2 ;;
        --fault-after) FAULT_AFTER=$2 ;;
        --fault-down) FAULT_DOWN=$2 ;;
        --watch) WATCH=$2 ;;
        --nics) NICS=$2 ;;
        --rxe-net) RXE_NET=$2 ;;
        --timeout) TIMEOUT=$2 ;;
        --mtu) MTU=$2 ;;
        --smp) SMP=$2 ;;
        --mem) MEM=$2 ;;
        --cpu) CPU=$2 ;;
        --env) ENVS+=("$2") ;;
        --out) JOB=$2 ;;
        esac
        shift 2
        ;;
    *) usage >&2; die "unknown argument: $opt" ;;
    esac
done
[ -n "$CMD_A" ] && [ -n "$CMD_B" ] || die "--cmd-a and --cmd-b are both needed"
for n in TIMEOUT MTU SMP MEM; do
    [[ ${!n} =~ ^[1-9][0-9]*$ ]] || die "--${n,,} must be a positive integer (got '${!n}')"
done
[[ $FAULT_AFTER =~ ^[0-9]+(\.[0-9]{1,6})?$ ]] || die "--fault-after wants seconds"
frac=${FAULT_AFTER#*.}
[ "$frac" = "$FAULT_AFTER" ] && frac=
frac=${frac}000000
FAULT_AFTER_US=$((${FAULT_AFTER%%.*} * 1000000 + 10#${frac:0:6}))
case $NICS in 1 | 3) ;; *) die "--nics: 1 or 3" ;; esac
case $RXE_NET in shared | rails) ;; *) die "--rxe-net: shared or rails" ;; esac
FAULT_NIC=0
case $FAULT in
'' | kill-a | kill-b | link-a | link-b) ;;
link-a:[0-9] | link-b:[0-9])
    FAULT_NIC=${FAULT#*:}
    [ "$FAULT_NIC" -lt "$NICS" ] || die "--fault $FAULT: no NIC $FAULT_NIC with --nics $NICS"
    ;;
*) die "--fault: kill-a|kill-b|link-a[:N]|link-b[:N]" ;;
esac
FAULT_DOWN_US=
if [ -n "$FAULT_DOWN" ]; then
    [[ $FAULT_DOWN =~ ^[0-9]+$ ]] || die "--fault-down wants whole seconds"
    [[ $FAULT == link-* ]] || die "--fault-down goes with a link fault"
    FAULT_DOWN_US=$((FAULT_DOWN * 1000000))
fi
for e in ${ENVS[@]+"${ENVS[@]}"}; do
    [[ $e =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env wants NAME=VALUE (got '$e')"
done

T0=$SECONDS
step() { say "$1 ($((SECONDS - T0))s)"; }

# ---- kernel and initramfs: the single-guest harness's, same cache ----------
"$RXE/setup.sh"
# shellcheck disable=SC1091
. "$CACHE/kernel.env"
key=$( {
    echo "$RXE_KPKG $RXE_KVER"
    sha256sum "$RXE/mkinitramfs.sh" "$RXE/init" /bin/busybox | cut -d' ' -f1
} | sha256sum | cut -c1-16)
INITRD=$CACHE/initramfs-$key.cpio
ensure_initrd() {
    [ -e "$INITRD" ] && return 0
    (
        flock 8
        if [ ! -e "$INITRD" ]; then
            "$RXE/mkinitramfs.sh" "$RXE_KROOT" "$RXE_KVER" "$INITRD"
            ls -1t "$CACHE"/initramfs-*.cpio | tail -n +5 | xargs -r rm -f
        fi
    ) 8>"$CACHE/.setup.lock"
    step "initramfs built: $INITRD"
}
ensure_initrd

# ---- job directories ---------------------------------------------------------
if [ -z "$JOB" ]; then
    JOB=$RUNS/$(date +%Y%m%d-%H%M%S)-$$
    mkdir -p "$RUNS"
    ls -1d "$RUNS"/[0-9]*-[0-9]* 2>/dev/null | sort | head -n -20 | while read -r old; do
        rm -rf "$old"
    done || true
    ln -sfn "${JOB##*/}" "$RUNS/latest"
fi
mkdir -p "$JOB"
JOB=$(cd "$JOB" && pwd -P)
[[ $JOB =~ [[:space:]] || $REPO =~ [[:space:]] ]] && die "paths with spaces are not supported"
[ ${#JOB} -lt 90 ] || die "job path too long for a unix socket: $JOB"
rm -rf "$JOB/A" "$JOB/B" "$JOB"/[AB]*.sock "$JOB/fault.txt" "$JOB/clock.txt"

q() { local s=${1//\'/\'\\\'\'}; printf "'%s'" "$s"; }
write_config() { # NAME IP PEER MAC CMD N (N: 1 for A, 2 for B)
    local d=$JOB/$1
    mkdir -p "$d/out"
    mkfifo "$d/mon.in" "$d/mon.out"
    {
        echo "RXE_REPO=$(q "$REPO")"
        echo "RXE_JOB=$(q "$d")"
        echo "RXE_OUT=$(q "$d/out")"
        echo "RXE_MTU=$(q "$MTU")"
        echo "RXE_CMD=$(q "$5")"
        echo "RXE_EXPOSE=$(q "$REPO")"
        echo "RXE_GUEST_SCRIPT=$(q "$HERE/guest.sh")"
        echo "RXE2_NAME=$1 RXE2_IP=$2 RXE2_PEER_IP=$3 RXE2_MAC=$4"
        echo "RXE2_NICS=$NICS RXE2_MAC1=52:54:00:12:35:0$6 RXE2_MAC2=52:54:00:12:36:0$6"
        echo "RXE2_IP1=192.0.3.$6 RXE2_IP2=$NET2.1$6"
        echo "RXE2_PEER_IP1=192.0.3.$((3 - $6)) RXE2_PEER_IP2=$NET2.1$((3 - $6))"
    } >"$d/config"
    {
        while IFS= read -r name; do
            echo "$name=$(q "${!name}")"
        done < <(compgen -e | grep -E '^(NCCL_|RXE_TEST_)' || true)
        for e in ${ENVS[@]+"${ENVS[@]}"}; do
            echo "${e%%=*}=$(q "${e#*=}")"
        done
    } >"$d/env"
}
# rails: a network per rail (192.0.3.0/24 and 192.0.4.0/24), as a rail-only
# fabric is addressed; shared: one /24 for all four rxe NICs.
NET2=$([ "$RXE_NET" = rails ] && echo 192.0.4 || echo 192.0.3)
write_config A 192.0.2.1 192.0.2.2 52:54:00:12:34:01 "$CMD_A" 1
write_config B 192.0.2.2 192.0.2.1 52:54:00:12:34:02 "$CMD_B" 2

# ---- one VM run at a time on this machine (this pair counts as one) ---------
exec 9>"$LOCK"
if ! flock -n 9; then
    say "waiting for $LOCK (another rxe VM is running)"
    flock 9
fi
ensure_initrd

declare -A QPID=()
cleanup() {
    local n
    for n in A B; do
        [ -n "${QPID[$n]:-}" ] || continue
        kill -TERM "${QPID[$n]}" 2>/dev/null || true
    done
    for n in A B; do
        [ -n "${QPID[$n]:-}" ] || continue
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            kill -0 "${QPID[$n]}" 2>/dev/null || break
            sleep 0.3
        done
        kill -KILL "${QPID[$n]}" 2>/dev/null || true
        wait "${QPID[$n]}" 2>/dev/null || true
    done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

KERNEL=$RXE_VMLINUZ
[ -n "${RXE_VMLINUX:-}" ] && [ "${RXE_BOOT:-pvh}" = pvh ] && KERNEL=$RXE_VMLINUX
# clocksource=hpet, not the single-guest harness's tsc=reliable: a guest
# booting on a loaded host can calibrate its TSC wrong (seen: its clock ran
# 3.3x fast, so a 60 s timeout in the guest lasted 18 s). QEMU's HPET counts
# host time, so guest timeouts and timings stay true, at ~1 us per
# clock_gettime. RXE2_KERNEL_ARGS replaces it, RXE_APPEND adds more.
APPEND="console=ttyS0 quiet loglevel=4 panic=-1 mitigations=off ${RXE2_KERNEL_ARGS-clocksource=hpet} ${RXE_APPEND:-}"
# --nics 3: NIC 1 (rxe0) and NIC 2 (rxe1) of this guest, as QEMU options.
rxe_nics() { # NAME PEER N (N: 1 for A, 2 for B)
    local dg="local.type=unix,local.path=$JOB/$1.%s.sock,remote.type=unix,remote.path=$JOB/$2.%s.sock"
    if [ "$RXE_NET" = shared ]; then
        # One hub per guest; each hub joined to the other guest's by a dgram
        # pair: the four NICs share one segment, as on one switch.
        # shellcheck disable=SC2059
        echo "-netdev dgram,id=hubnet,$(printf "$dg" hub hub)"
        echo "-netdev hubport,id=hubup,hubid=1,netdev=hubnet"
        echo "-netdev hubport,id=n1,hubid=1 -netdev hubport,id=n2,hubid=1"
    else
        # shellcheck disable=SC2059
        echo "-netdev dgram,id=n1,$(printf "$dg" 1 1) -netdev dgram,id=n2,$(printf "$dg" 2 2)"
    fi
    echo "-device virtio-net-pci,netdev=n1,mac=52:54:00:12:35:0$3"
    echo "-device virtio-net-pci,netdev=n2,mac=52:54:00:12:36:0$3"
}
start_guest() { # NAME MAC PEER
    local n=$1 d=$JOB/$1 more=()
    if [ "$NICS" = 3 ]; then
        read -r -a more <<<"$(rxe_nics "$1" "$3" "${2: -1}" | tr '\n' ' ')"
    fi
    # timeout runs QEMU as its child; QEMU's own PID is in qemu.pid.
    timeout -k 10 "$TIMEOUT" qemu-system-x86_64 -name "rxe2-$n" \
        -accel tcg,thread=multi -smp "$SMP" -m "$MEM" -cpu "$CPU" \
        -nodefaults -no-user-config -display none -no-reboot \
        -kernel "$KERNEL" -initrd "$INITRD" -append "$APPEND" \
        -serial "file:$d/console.log" -pidfile "$d/qemu.pid" \
        -chardev "pipe,id=mon,path=$d/mon" -mon chardev=mon,mode=readline \
        -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
        -virtfs "local,path=$d,mount_tag=rxejob,security_model=none,multidevs=remap" \
        -netdev "dgram,id=n0,local.type=unix,local.path=$JOB/$1.sock,remote.type=unix,remote.path=$JOB/$3.sock" \
        -device "virtio-net-pci,netdev=n0,mac=$2" ${more[@]+"${more[@]}"} </dev/null >"$d/qemu.log" 2>&1 &
    QPID[$n]=$!
}
nicw=
if [ "$NICS" = 3 ]; then nicw=", 3 NICs each (rxe NICs: $RXE_NET)"; fi
step "booting two guests ($RXE_KVER, smp $SMP, mem $MEM, mtu $MTU, timeout ${TIMEOUT}s$nicw); job $JOB"
TBOOT=$SECONDS
start_guest A 52:54:00:12:34:01 B
start_guest B 52:54:00:12:34:02 A

# ---- watch: the fault, and the events after it -------------------------------
running() { kill -0 "${QPID[$1]}" 2>/dev/null; }
now_us() { echo "${EPOCHREALTIME/./}"; }
secs() { printf '%d.%d' $(($1 / 1000000)) $(($1 % 1000000 / 100000)); } # us -> 1 decimal
declare -A SEEN=([A]=0 [B]=0) LSEEN=([A]=0 [B]=0) READY_AT=()
t_fault= t_ready= t_up=
epoch() { printf '%d.%06d' $(($1 / 1000000)) $(($1 % 1000000)); }
fault_guest() { local n=${FAULT#*-}; n=${n%:*}; echo "${n^^}"; }
fault_do() {
    local n what=${FAULT%%-*} t
    n=$(fault_guest)
    t=$(now_us)
    if [ "$what" = kill ]; then
        kill -KILL "$(cat "$JOB/$n/qemu.pid")"
    else
        echo "set_link n$FAULT_NIC off" >"$JOB/$n/mon.in"
    fi
    t_fault=$(now_us)
    say "fault $FAULT done $(secs $((t_fault - t_ready))) s after READY"
    echo "fault $FAULT at $(epoch "$t")" >>"$JOB/fault.txt"
}
link_up() {
    local t
    t=$(now_us)
    echo "set_link n$FAULT_NIC on" >"$JOB/$(fault_guest)/mon.in"
    t_up=$(now_us)
    say "link of $FAULT back up $(secs $((t_up - t_fault))) s after the fault"
    echo "link-up $FAULT at $(epoch "$t")" >>"$JOB/fault.txt"
}
scan_events() {
    local n f line i
    for n in A B; do
        f=$JOB/$n/out/events
        [ -s "$f" ] || continue
        i=0
        while IFS= read -r line; do
            i=$((i + 1))
            [ "$i" -gt "${SEEN[$n]}" ] || continue
            SEEN[$n]=$i
            # "READY <text>" (peer-dies) or a bare "READY" (failover-loop)
            if [ -z "$t_ready" ] && [[ $line =~ \ READY( |$) ]]; then
                t_ready=$(now_us)
                say "guest $n: $line"
            elif [ -n "$t_fault" ]; then
                local dt
                dt=$(secs $(($(now_us) - t_fault)))
                say "guest $n +${dt}s after $FAULT: $line"
                echo "$n +$dt $line" >>"$JOB/fault.txt"
            else
                say "guest $n (before the fault): $line"
                echo "$n before $line" >>"$JOB/fault.txt"
            fi
        done <"$f"
    done
    if [ -n "$WATCH" ]; then scan_logs; fi
}
# The lines of the commands' output that match --watch, timed after the fault.
scan_logs() {
    local n f line dt
    for n in A B; do
        f=$JOB/$n/out/cmd.log
        [ -s "$f" ] || continue
        while IFS= read -r line; do
            LSEEN[$n]=$((LSEEN[$n] + 1))
            [ -n "$t_fault" ] && [[ $line =~ $WATCH ]] || continue
            dt=$(($(now_us) - t_fault))
            dt=$(printf '%d.%02d' $((dt / 1000000)) $((dt % 1000000 / 10000)))
            say "guest $n +${dt}s after $FAULT: log: ${line:0:200}"
            echo "$n +$dt log: $line" >>"$JOB/fault.txt"
        done < <(tail -n "+$((LSEEN[$n] + 1))" "$f")
    done
}
while running A || running B; do
    if [ -n "$FAULT" ]; then
        scan_events
        if [ -n "$t_ready" ] && [ -z "$t_fault" ] &&
            [ $(($(now_us) - t_ready)) -ge "$FAULT_AFTER_US" ]; then
            fault_do
        fi
        if [ -n "$t_fault" ] && [ -z "$t_up" ] && [ -n "$FAULT_DOWN_US" ] &&
            [ $(($(now_us) - t_fault)) -ge "$FAULT_DOWN_US" ] && running "$(fault_guest)"; then
            link_up
        fi
    fi
    sleep 0.05
done
[ -n "$FAULT" ] && scan_events
declare -A QRC=()
for n in A B; do
    QRC[$n]=0
    wait "${QPID[$n]}" 2>/dev/null || QRC[$n]=$?
    QPID[$n]=
done

# ---- results ---------------------------------------------------------------
rc=0
for n in A B; do
    d=$JOB/$n
    sed "s/^/$n| /" "$d/console.log" 2>/dev/null | tr -d '\r'
    r=
    [ -s "$d/exit-status" ] && r=$(tr -dc '0-9' <"$d/exit-status")
    [ -z "$r" ] && r=$(tr -d '\r' <"$d/console.log" 2>/dev/null |
        sed -n 's/^rxe-init: RXE_EXIT=\([0-9]*\).*/\1/p' | tail -n1)
    if [ "$FAULT" = "kill-${n,,}" ]; then
        say "guest $n: killed by the fault (status not counted)"
        continue
    fi
    if [ "${QRC[$n]}" = 124 ] || [ "${QRC[$n]}" = 137 ]; then
        say "guest $n timed out after ${TIMEOUT}s"
        r=124
    elif [ -z "$r" ]; then
        say "guest $n gave no exit status (QEMU exit ${QRC[$n]}); console $d/console.log"
        r=125
    fi
    say "guest $n: exit $r"
    [ "$rc" = 0 ] && rc=$r
done
[ -s "$JOB/fault.txt" ] && say "fault timings: $JOB/fault.txt" && sed 's/^/rxe2: | /' "$JOB/fault.txt" >&2
# Each guest's clock against the host's (guest.sh wrote clock.1..5).
for n in A B; do
    best=
    for i in 1 2 3 4 5; do
        f=$JOB/$n/out/clock.$i
        [ -s "$f" ] || continue
        g=$(tr -dc '0-9.' <"$f") h=$(stat -c %.6Y "$f")
        [ -n "$g" ] || continue
        best=$(awk -v h="$h" -v g="$g" -v b="$best" 'BEGIN { d = h - g; if (b == "" || d < b) b = d; printf "%.6f", b }')
    done
    if [ -n "$best" ]; then
        echo "$n $best" >>"$JOB/clock.txt"
        say "guest $n: host clock minus guest clock $best s"
    fi
done
say "exit $rc; guests $((SECONDS - TBOOT))s, total $((SECONDS - T0))s; job $JOB"
exit "$rc"
