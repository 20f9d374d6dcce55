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

setup_net || fail "network"
setup_rxe || fail "rxe devices"

export RXE_GUEST=1 RXE_REPO RXE_OUT RXE_MTU
export RXE_DEV0=rxe0 RXE_DEV1=rxe1 RXE_NETDEV0=veth0 RXE_NETDEV1=veth1
export RXE_IP0=192.0.2.1 RXE_IP1=192.0.2.2
export RXE_HARNESS=$RXE_REPO/test/rxe
export HOME=/tmp TMPDIR=/tmp LANG=C.UTF-8
# Extra variables from run.sh --env and the forwarded NCCL_*/RXE_TEST* ones.
[ -f "$RXE_JOB/env" ] && set -a && . "$RXE_JOB/env" && set +a

say "ready: rxe0/veth0 $RXE_IP0 gid $RXE_GID_INDEX0, rxe1/veth1 $RXE_IP1 gid $RXE_GID_INDEX1, mtu $RXE_MTU (uptime $(cut -d' ' -f1 /proc/uptime)s)"
cd "$RXE_REPO" || fail "cd $RXE_REPO"
if [ -n "${RXE_CMD:-}" ]; then
    bash -c "$RXE_CMD"
else
    bash "$RXE_PAYLOAD"
fi
