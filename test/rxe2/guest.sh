#!/bin/bash
# One guest of the two-guest harness (test/rxe2/run.sh), run by test/rxe/init
# chrooted into the host's root (read-only 9p). Sets up this guest's node:
#   the virtio NIC (MAC from <job>/config) as $RXE2_IP/24, MTU $RXE_MTU,
#   rxe0 on it (RoCE v2, GID ::ffff:$RXE2_IP)
# then runs <job>/config's command in the repo root and exits with its status.
# The NIC's only link is a unix socket to the other guest's QEMU: nothing
# outside the two guests is reachable.
set -uo pipefail

# shellcheck disable=SC1091
. "$RXE_JOB/config"
# shellcheck source=test/rxe/lib.sh
. "$RXE_REPO/test/rxe/lib.sh"

say() { echo "rxe2-guest $RXE2_NAME: $*"; }
fail() { say "setup failed: $*"; exit 125; }

# The netdev of the virtio NIC, found by its MAC (no udev here to rename it).
nic=
for d in /sys/class/net/*; do
    read -r mac <"$d/address" 2>/dev/null || continue
    [ "$mac" = "$RXE2_MAC" ] && nic=${d##*/}
done
[ -n "$nic" ] || fail "no netdev with MAC $RXE2_MAC (virtio_net not loaded?)"

ip -batch - <<END || fail "network on $nic"
link set lo up
link set $nic mtu $RXE_MTU
addr add $RXE2_IP/24 dev $nic
link set $nic up
END
rdma link add rxe0 type rxe netdev "$nic" || fail "rdma link add rxe0 on $nic"

deadline=$((SECONDS + 30)) gid='' state=''
while [ $SECONDS -lt $deadline ]; do
    gid=$(rxe_ipv4_gid_index rxe0 "$RXE2_IP") &&
        read -r state </sys/class/infiniband/rxe0/ports/1/state && [[ $state == *ACTIVE ]] && break
    sleep 0.1
done
[ -n "$gid" ] || fail "no IPv4 GID on rxe0 after 30 s"
[[ $state == *ACTIVE ]] || fail "rxe0 port 1 not ACTIVE: $state"
# The NIC must also be RUNNING (carrier): the plugin picks its out-of-band
# interface among those up, running and addressed, and a command started
# before virtio-net's carrier came up got "lo" (its peer then connected to
# 127.0.0.1).
while [ $SECONDS -lt $deadline ] && [ "$(cat /sys/class/net/$nic/operstate 2>/dev/null)" != up ]; do
    sleep 0.1
done
[ "$(cat /sys/class/net/$nic/operstate 2>/dev/null)" = up ] || fail "$nic not running (operstate $(cat /sys/class/net/$nic/operstate))"

export RXE_GUEST=1 RXE_REPO RXE_OUT RXE_MTU RXE2_NAME RXE2_IP RXE2_PEER_IP
export RXE_DEV0=rxe0 RXE_NETDEV0=$nic RXE_IP0=$RXE2_IP RXE_GID_INDEX0=$gid
export RXE_HARNESS=$RXE_REPO/test/rxe
export HOME=/tmp TMPDIR=/tmp LANG=C.UTF-8
[ -f "$RXE_JOB/env" ] && set -a && . "$RXE_JOB/env" && set +a

read -r cs </sys/devices/system/clocksource/clocksource0/current_clocksource
say "ready: rxe0/$nic $RXE2_IP gid $gid, peer $RXE2_PEER_IP, mtu $RXE_MTU, clock $cs (uptime $(cut -d' ' -f1 /proc/uptime)s)"
: >"$RXE_OUT/ready"
cd "$RXE_REPO" || fail "cd $RXE_REPO"
bash -c "$RXE_CMD" 2>&1 | tee "$RXE_OUT/cmd.log"
rc=${PIPESTATUS[0]}
say "command exit $rc (uptime $(cut -d' ' -f1 /proc/uptime)s)"
exit "$rc"
