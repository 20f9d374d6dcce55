#!/bin/bash
# Address and port changes while the plugin runs (issue 10 defect 6), on
# real rdma-core + rxe: build/test/unit/test_ib_events_live drives one
# process (sender on rxe0, receiver on rxe1) and runs this script's steps
# between its phases (RAIL_TEST_EVENTS_*):
#   readdress: veth0 192.0.2.1 -> 192.0.2.11 (ip addr del/add, and the policy
#     routes of guest.sh for the new address): GID_CHANGE is logged old ->
#     new and a connection made afterwards carries data with the new GID;
#   linkdown: ip link set veth0 down: PORT_ERR, a new connect fails with the
#     named error, the running comm fails within 10 s (not hang);
#   linkup: ip link set veth0 up (and the routes again): PORT_ACTIVE, a new
#     connection works.
# rxe-timeout: 300
set -uo pipefail
. "$RXE_HARNESS/lib.sh"

new_ip=192.0.2.11

wait_for() {	# SECONDS DESCRIPTION COMMAND...: poll every 0.1 s
    local n=$(($1 * 10)) what=$2
    shift 2
    while ((n-- > 0)); do
        "$@" && return 0
        sleep 0.1
    done
    echo "$what: not within the time" >&2
    return 1
}
port_is() { grep -q "$2" "/sys/class/infiniband/$1/ports/1/state"; }
gid_there() { rxe_ipv4_gid_index rxe0 "$new_ip" >/dev/null; }
routes() {
    ip route replace 192.0.2.2/32 dev veth0 src "$new_ip" table 101 &&
        { ip rule list pref 99 | grep -q . || ip rule add pref 99 from "$new_ip" iif lo lookup 101; } &&
        ip route replace "$new_ip/32" dev veth1 src 192.0.2.2 table 102
}

case "${1:-}" in
readdress)
    ip addr del 192.0.2.1/24 dev veth0 && ip addr add "$new_ip/24" dev veth0 && routes &&
        wait_for 10 "GID of $new_ip on rxe0" gid_there || exit 1
    rxe_gid_table rxe0
    exit 0 ;;
linkdown)
    ip link set veth0 down && wait_for 10 "rxe0 DOWN" port_is rxe0 DOWN
    exit ;;
linkup)
    ip link set veth0 up && wait_for 10 "rxe0 ACTIVE" port_is rxe0 ACTIVE &&
        wait_for 10 "rxe1 ACTIVE" port_is rxe1 ACTIVE && routes &&
        wait_for 10 "GID of $new_ip on rxe0" gid_there || exit 1
    rxe_gid_table rxe0
    exit 0 ;;
esac

# The tests after this one expect guest.sh's topology: veth0 up at
# 192.0.2.1 with its policy routes and rxe0's GID for it.
restore() {
    ip link set veth0 up
    ip addr del "$new_ip/24" dev veth0 2>/dev/null
    ip addr replace 192.0.2.1/24 dev veth0
    ip rule del pref 99 2>/dev/null
    ip route replace 192.0.2.2/32 dev veth0 src 192.0.2.1 table 101
    ip route del "$new_ip/32" dev veth1 table 102 2>/dev/null
    ip route replace 192.0.2.1/32 dev veth1 src 192.0.2.2 table 102
    wait_for 10 "rxe0 ACTIVE" port_is rxe0 ACTIVE &&
        wait_for 10 "GID of 192.0.2.1 on rxe0" rxe_ipv4_gid_index rxe0 192.0.2.1 >/dev/null
}

t=${RXE_TEST_EVENTS_BIN:-build/test/unit/test_ib_events_live}	# another build: RXE_TEST_EVENTS_BIN
[ -x "$t" ] || { echo "$t missing: run make tests"; exit 1; }
self=$(realpath "$0")
export RAIL_TEST_EVENTS_NEW_GID="::ffff:$new_ip"
export RAIL_TEST_EVENTS_READDRESS="bash $self readdress"
export RAIL_TEST_EVENTS_LINKDOWN="bash $self linkdown"
export RAIL_TEST_EVENTS_LINKUP="bash $self linkup"
"$t"
rc=$?
restore || { echo "could not restore veth0 192.0.2.1 and rxe0's GID for the next tests"; rc=1; }
rxe_gid_table rxe0
exit $rc
