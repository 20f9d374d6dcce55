#!/bin/bash
# One guest of the two-guest harness (test/rxe2/run.sh), run by test/rxe/init
# chrooted into the host's root (read-only 9p). Sets up this guest's node:
#   the virtio NIC (MAC from <job>/config) as $RXE2_IP/24, MTU $RXE_MTU,
#   rxe0 on it (RoCE v2, GID ::ffff:$RXE2_IP)
# then runs <job>/config's command in the repo root and exits with its status.
# The NIC's only link is a unix socket to the other guest's QEMU: nothing
# outside the two guests is reachable.
# With RXE2_NICS=3 (run.sh --nics 3) the first NIC carries only the
# out-of-band traffic (no rxe), and two more NICs carry rxe0 ($RXE2_IP1) and
# rxe1 ($RXE2_IP2), one /24 on one segment or two rails (run.sh --rxe-net):
# arp_ignore=1 and arp_announce=2 so each address is answered for only on its
# own NIC (rxe takes a packet on the device of the NIC it came in on).
set -uo pipefail

# shellcheck disable=SC1091
. "$RXE_JOB/config"
# shellcheck source=test/rxe/lib.sh
. "$RXE_REPO/test/rxe/lib.sh"

say() { echo "rxe2-guest $RXE2_NAME: $*"; }
fail() { say "setup failed: $*" >&2; exit 125; }

# The netdev of a virtio NIC, found by its MAC (no udev here to rename it).
nic_of() {
    local d mac
    for d in /sys/class/net/*; do
        read -r mac <"$d/address" 2>/dev/null || continue
        [ "$mac" = "$1" ] && echo "${d##*/}" && return 0
    done
    fail "no netdev with MAC $1 (virtio_net not loaded?)"
}
nic=$(nic_of "$RXE2_MAC") || exit 125

ip -batch - <<END || fail "network on $nic"
link set lo up
link set $nic mtu $RXE_MTU
addr add $RXE2_IP/24 dev $nic
link set $nic up
END
# rxe_up DEV NETDEV IP: add DEV on NETDEV, wait for its IPv4 GID and ACTIVE;
# prints the GID index.
rxe_up() {
    local gid='' state=''
    rdma link add "$1" type rxe netdev "$2" || fail "rdma link add $1 on $2"
    while [ $SECONDS -lt $deadline ]; do
        gid=$(rxe_ipv4_gid_index "$1" "$3") &&
            read -r state <"/sys/class/infiniband/$1/ports/1/state" && [[ $state == *ACTIVE ]] && break
        sleep 0.1
    done
    [ -n "$gid" ] || fail "no IPv4 GID on $1 after 30 s"
    [[ $state == *ACTIVE ]] || fail "$1 port 1 not ACTIVE: $state"
    echo "$gid"
}
deadline=$((SECONDS + 30))
oob=$nic
if [ "${RXE2_NICS:-1}" = 3 ]; then
    nic=$(nic_of "$RXE2_MAC1") || exit 125
    nic1=$(nic_of "$RXE2_MAC2") || exit 125
    for d in all default "$nic" "$nic1"; do
        for f in rp_filter=0 arp_ignore=1 arp_announce=2; do
            echo "${f#*=}" >"/proc/sys/net/ipv4/conf/$d/${f%=*}" || fail "sysctl $d ${f%=*}"
        done
    done
    ip -batch - <<END || fail "network on $nic, $nic1"
link set $nic mtu $RXE_MTU
addr add $RXE2_IP1/24 dev $nic
link set $nic up
link set $nic1 mtu $RXE_MTU
addr add $RXE2_IP2/24 dev $nic1
link set $nic1 up
END
    gid=$(rxe_up rxe0 "$nic" "$RXE2_IP1") || exit 125
    gid1=$(rxe_up rxe1 "$nic1" "$RXE2_IP2") || exit 125
    export RXE_DEV1=rxe1 RXE_NETDEV1=$nic1 RXE_IP1=$RXE2_IP2 RXE_GID_INDEX1=$gid1
    export RXE2_PEER_IP0=$RXE2_PEER_IP1 RXE2_PEER_IP1=$RXE2_PEER_IP2
    rxe_ip=$RXE2_IP1
else
    gid=$(rxe_up rxe0 "$nic" "$RXE2_IP") || exit 125
    rxe_ip=$RXE2_IP
fi
# The NIC must also be RUNNING (carrier): the plugin picks its out-of-band
# interface among those up, running and addressed, and a command started
# before virtio-net's carrier came up got "lo" (its peer then connected to
# 127.0.0.1).
for n in $oob ${nic1:+$nic $nic1}; do
    while [ $SECONDS -lt $deadline ] && [ "$(cat /sys/class/net/"$n"/operstate 2>/dev/null)" != up ]; do
        sleep 0.1
    done
    [ "$(cat /sys/class/net/"$n"/operstate 2>/dev/null)" = up ] || fail "$n not running (operstate $(cat /sys/class/net/"$n"/operstate))"
done

export RXE_GUEST=1 RXE_REPO RXE_OUT RXE_MTU RXE2_NAME RXE2_IP RXE2_PEER_IP RXE2_OOB_IF=$oob
export RXE_DEV0=rxe0 RXE_NETDEV0=$nic RXE_IP0=$rxe_ip RXE_GID_INDEX0=$gid
export RXE_HARNESS=$RXE_REPO/test/rxe
export HOME=/tmp TMPDIR=/tmp LANG=C.UTF-8
[ -f "$RXE_JOB/env" ] && set -a && . "$RXE_JOB/env" && set +a

read -r cs </sys/devices/system/clocksource/clocksource0/current_clocksource
say "ready: rxe0/$nic $rxe_ip gid $gid${nic1:+, rxe1/$nic1 $RXE2_IP2 gid $gid1, out-of-band $oob $RXE2_IP}, peer $RXE2_PEER_IP, mtu $RXE_MTU, clock $cs (uptime $(cut -d' ' -f1 /proc/uptime)s)"
# This clock against the host's: run.sh compares each value with the host
# mtime of its file (9p writes through at once).
for i in 1 2 3 4 5; do
    echo "$EPOCHREALTIME" >"$RXE_OUT/clock.$i"
done
: >"$RXE_OUT/ready"
cd "$RXE_REPO" || fail "cd $RXE_REPO"
bash -c "$RXE_CMD" 2>&1 | tee "$RXE_OUT/cmd.log"
rc=${PIPESTATUS[0]}
say "command exit $rc (uptime $(cut -d' ' -f1 /proc/uptime)s)"
exit "$rc"
