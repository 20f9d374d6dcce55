#!/bin/bash
# Runs inside the guest, chrooted into the host's root filesystem (read-only
# 9p), started by /init. Sets up the Soft-RoCE topology, then runs the payload
# or the command from <job>/config in the repo root and exits with its status.
#
# Topology (one network namespace):
#   veth0 192.0.2.1/24 <-> veth1 192.0.2.2/24, MTU $RXE_MTU
#   rxe0 on veth0, rxe1 on veth1 (RoCE v2)
# Both addresses are local, so by default 192.0.2.1 -> 192.0.2.2 would go over
# lo, where rxe never sees it. Per-source policy routes for locally generated
# traffic (ahead of the local table) send it out of the veth instead.
#
# RXE_TOPO=bridge (run.sh --topo bridge): four devices, any one of which can
# fail alone while the others still reach each other:
#   veth$i 192.0.2.$((i+1))/24 <-> br0p$i, the br0p$i enslaved to br0,
#   rxe$i on veth$i (i = 0..3); `ip link set br0p$i down` fails rxe$i only.
# Same policy routing per source address (one table per device, a /32 route
# to each other device; rxe itself only needs accept_local=1, as its lookups
# are bound to the netdev: README.md), plus arp_ignore=1 / arp_announce=2 so that only the
# owner of an address answers ARP for it (all four are local addresses: with
# the default every veth would answer, and a packet for rxe1 could arrive on
# veth2 and be handed to rxe2). See README.md "The bridge topology".
set -uo pipefail

# shellcheck disable=SC1091
. "$RXE_JOB/config"
# shellcheck source=test/rxe/lib.sh
. "$RXE_REPO/test/rxe/lib.sh"

say() { echo "rxe-guest: $*"; }
fail() { say "setup failed: $*"; exit 125; }

# Every exec costs ~0.1 s in the guest (emulated CPU, binaries over 9p):
# batch the ip and rdma commands, write the sysctls with builtins.
setup_net() {
    ip -batch - <<END || return 1
link set lo up
link add veth0 mtu $RXE_MTU type veth peer name veth1 mtu $RXE_MTU
addr add 192.0.2.1/24 dev veth0
addr add 192.0.2.2/24 dev veth1
END
    local dev f
    for dev in all default veth0 veth1; do
        for f in rp_filter=0 accept_local=1; do
            echo "${f#*=}" >"/proc/sys/net/ipv4/conf/$dev/${f%=*}" || return 1
        done
    done
    ip -batch - <<END || return 1
link set veth0 up
link set veth1 up
route add 192.0.2.2/32 dev veth0 src 192.0.2.1 table 101
route add 192.0.2.1/32 dev veth1 src 192.0.2.2 table 102
rule add pref 100 from 192.0.2.1 iif lo lookup 101
rule add pref 101 from 192.0.2.2 iif lo lookup 102
rule add pref 1000 lookup local
rule del pref 0 lookup local
END
}

setup_rxe() {
    rdma -b - <<END || return 1
link add rxe0 type rxe netdev veth0
link add rxe1 type rxe netdev veth1
END
    local i deadline=$((SECONDS + 30)) g0='' g1='' s0='' s1=''
    while [ $SECONDS -lt $deadline ]; do
        g0=$(rxe_ipv4_gid_index rxe0 192.0.2.1) && g1=$(rxe_ipv4_gid_index rxe1 192.0.2.2) &&
            read -r s0 </sys/class/infiniband/rxe0/ports/1/state &&
            read -r s1 </sys/class/infiniband/rxe1/ports/1/state &&
            [[ $s0 == *ACTIVE && $s1 == *ACTIVE ]] && break
        sleep 0.1
    done
    [ -n "$g0" ] && [ -n "$g1" ] || { say "no IPv4 GID after 30 s"; return 1; }
    [[ $s0 == *ACTIVE && $s1 == *ACTIVE ]] || { say "ports not ACTIVE: $s0 / $s1"; return 1; }
    export RXE_GID_INDEX0=$g0 RXE_GID_INDEX1=$g1
}

BR_N=4	# devices of the bridge topology

setup_net_bridge() {
    local i j cmds f dev
    cmds="link set lo up
link add br0 mtu $RXE_MTU type bridge stp_state 0 forward_delay 0"
    for ((i = 0; i < BR_N; i++)); do
        cmds+="
link add veth$i mtu $RXE_MTU type veth peer name br0p$i mtu $RXE_MTU
link set br0p$i master br0
addr add 192.0.2.$((i + 1))/24 dev veth$i"
    done
    ip -batch - <<<"$cmds" || return 1
    # No addresses, so no IPv6 chatter, on the bridge side.
    for dev in br0 br0p0 br0p1 br0p2 br0p3; do
        echo 1 >"/proc/sys/net/ipv6/conf/$dev/disable_ipv6" || return 1
    done
    for dev in all default veth0 veth1 veth2 veth3; do
        for f in rp_filter=0 accept_local=1 arp_ignore=1 arp_announce=2; do
            echo "${f#*=}" >"/proc/sys/net/ipv4/conf/$dev/${f%=*}" || return 1
        done
    done
    cmds="link set br0 up"
    for ((i = 0; i < BR_N; i++)); do
        cmds+="
link set br0p$i up
link set veth$i up
rule add pref $((100 + i)) from 192.0.2.$((i + 1)) iif lo lookup $((101 + i))"
        for ((j = 0; j < BR_N; j++)); do
            [ "$i" = "$j" ] && continue
            cmds+="
route add 192.0.2.$((j + 1))/32 dev veth$i src 192.0.2.$((i + 1)) table $((101 + i))"
        done
    done
    cmds+="
rule add pref 1000 lookup local
rule del pref 0 lookup local"
    ip -batch - <<<"$cmds"
}

setup_rxe_bridge() {
    local i cmds='' g s deadline=$((SECONDS + 30)) ok
    for ((i = 0; i < BR_N; i++)); do
        cmds+="link add rxe$i type rxe netdev veth$i
"
    done
    rdma -b - <<<"$cmds" || return 1
    while :; do
        ok=1
        for ((i = 0; i < BR_N; i++)); do
            g='' s=''
            g=$(rxe_ipv4_gid_index "rxe$i" "192.0.2.$((i + 1))") &&
                read -r s <"/sys/class/infiniband/rxe$i/ports/1/state" &&
                [[ $s == *ACTIVE ]] || { ok=0; break; }
            export "RXE_GID_INDEX$i=$g"
        done
        [ $ok = 1 ] && break
        [ $SECONDS -lt $deadline ] || { say "rxe$i: no IPv4 GID or not ACTIVE ($s) after 30 s"; return 1; }
        sleep 0.1
    done
    for ((i = 0; i < BR_N; i++)); do
        export "RXE_DEV$i=rxe$i" "RXE_NETDEV$i=veth$i" "RXE_OUTER$i=br0p$i" "RXE_IP$i=192.0.2.$((i + 1))"
    done
}

TOPO=${RXE_TOPO:-veth}
case $TOPO in
veth)
    setup_net || fail "network"
    setup_rxe || fail "rxe devices"
    ;;
bridge)
    setup_net_bridge || fail "network (bridge topology)"
    setup_rxe_bridge || fail "rxe devices (bridge topology)"
    ;;
*) fail "unknown topology RXE_TOPO=$TOPO" ;;
esac

export RXE_GUEST=1 RXE_REPO RXE_OUT RXE_MTU RXE_TOPO=$TOPO
export RXE_DEV0=rxe0 RXE_DEV1=rxe1 RXE_NETDEV0=veth0 RXE_NETDEV1=veth1
export RXE_IP0=192.0.2.1 RXE_IP1=192.0.2.2
export RXE_HARNESS=$RXE_REPO/test/rxe
export HOME=/tmp TMPDIR=/tmp LANG=C.UTF-8
# Extra variables from run.sh --env and the forwarded NCCL_*/RXE_TEST* ones.
[ -f "$RXE_JOB/env" ] && set -a && . "$RXE_JOB/env" && set +a
RXE_TOPO=$TOPO	# what was built, whatever the env file says

[ "$TOPO" = bridge ] && say "bridge topology: rxe2/veth2 $RXE_IP2 gid $RXE_GID_INDEX2, rxe3/veth3 $RXE_IP3 gid $RXE_GID_INDEX3; outer ends br0p0..3 in br0"
say "ready: rxe0/veth0 $RXE_IP0 gid $RXE_GID_INDEX0, rxe1/veth1 $RXE_IP1 gid $RXE_GID_INDEX1, mtu $RXE_MTU (uptime $(cut -d' ' -f1 /proc/uptime)s)"
cd "$RXE_REPO" || fail "cd $RXE_REPO"
if [ -n "${RXE_CMD:-}" ]; then
    bash -c "$RXE_CMD"
else
    bash "$RXE_PAYLOAD"
fi
