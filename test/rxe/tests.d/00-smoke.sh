#!/bin/bash
# Smoke test of the Soft-RoCE harness itself: both rxe devices are ACTIVE and
# real verbs traffic flows rxe1 -> rxe0 over the IPv4-mapped RoCE v2 GIDs
# (ibv_rc_pingpong, ib_write_bw, ib_write_lat). Judge perftest by its exit
# status, not its numbers (TCG timing can print 0.00).
# rxe-timeout: 240
set -uo pipefail
. "$RXE_HARNESS/lib.sh"

fails=0
check() { if "$@"; then return 0; fi; echo "FAILED: $*"; fails=$((fails + 1)); return 1; }

port_active() {
    local dev=$1 info
    info=$(ibv_devinfo -d "$dev") || { echo "ibv_devinfo -d $dev failed"; return 1; }
    printf '%s\n' "$info" | grep -E 'hca_id|transport|state|active_mtu|link_layer'
    printf '%s\n' "$info" | grep -q 'state:[[:space:]]*PORT_ACTIVE' || {
        echo "$dev: port not ACTIVE"
        return 1
    }
}

check port_active rxe0
check port_active rxe1

# GID indices from sysfs, not hard-coded (guest.sh exports them too).
g0=$(rxe_ipv4_gid_index rxe0 "$RXE_IP0") || { echo "rxe0 has no IPv4 GID for $RXE_IP0"; exit 1; }
g1=$(rxe_ipv4_gid_index rxe1 "$RXE_IP1") || { echo "rxe1 has no IPv4 GID for $RXE_IP1"; exit 1; }
echo "IPv4 GID index: rxe0 $g0, rxe1 $g1"

check rxe_pair rc_pingpong 18600 60 \
    ibv_rc_pingpong -d rxe0 -g "$g0" -p 18600 -n 200 -s 4096 -c -- \
    ibv_rc_pingpong -d rxe1 -g "$g1" -p 18600 -n 200 -s 4096 -c "$RXE_IP0"

check rxe_pair write_bw 18601 90 \
    ib_write_bw -d rxe0 -x "$g0" -p 18601 -s 65536 -n 500 -F -- \
    ib_write_bw -d rxe1 -x "$g1" -p 18601 -s 65536 -n 500 -F "$RXE_IP0"

check rxe_pair write_lat 18602 90 \
    ib_write_lat -d rxe0 -x "$g0" -p 18602 -s 8 -n 1000 -F -- \
    ib_write_lat -d rxe1 -x "$g1" -p 18602 -s 8 -n 1000 -F "$RXE_IP0"

[ "$fails" -eq 0 ] || { echo "smoke: $fails check(s) failed"; exit 1; }
echo "smoke: all checks passed"
