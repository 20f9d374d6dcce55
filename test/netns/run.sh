#!/bin/bash
# rail-bench across "hosts": two network namespaces joined by a veth pair.
#
#   test/netns/run.sh BUILD_DIR        (make test-netns)
#
# As root: namespaces rnA-<pid> and rnB-<pid>, veth rbA<pid> (10.77.91.1/24)
# <-> rbB<pid> (10.77.91.2/24), a subnet that exists only inside them.
# `rail-bench --server` runs in A, `--client` in B, with the TCP transport on
# the veth (NCCL_SOCKET_IFNAME), and moves 1 GiB with every byte checked.
# Then it proves it can fail: a flipped byte must be reported as a
# mismatch, and a client against a port where nothing listens must exit
# non-zero with the friendly message. Last, a short size sweep with --csv on
# both sides: a header and one row per size, the sizes of the table.
# Everything is removed on every exit.
# Not root, or no `ip netns`: prints SKIP and exits 0.
set -uo pipefail

build=${1:-build}
bench=$build/rail-bench
total=${RAIL_NETNS_TOTAL:-1G}
tmo=${RAIL_NETNS_TIMEOUT:-240}
port=18791
nsa=rnA-$$ nsb=rnB-$$ va=rbA$$ vb=rbB$$
ipa=10.77.91.1 ipb=10.77.91.2
out=$(mktemp -d /tmp/rail-netns.XXXXXX)
fails=0

skip() { echo "SKIP: test-netns: $*"; exit 0; }
[ -x "$bench" ] || { echo "test-netns: $bench missing: run make" >&2; exit 1; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (run as root)"
command -v ip >/dev/null || skip "no ip(8) (package iproute2)"
command -v timeout >/dev/null || skip "no timeout(1) (package coreutils)"

cleanup() {
    ip netns del "$nsa" 2>/dev/null
    ip netns del "$nsb" 2>/dev/null   # the veth pair goes with its namespaces
    rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$nsa" 2>"$out/err" || skip "ip netns add failed: $(cat "$out/err")"
ip netns add "$nsb" || { echo "test-netns: ip netns add $nsb failed"; exit 1; }
ip link add "$va" netns "$nsa" type veth peer name "$vb" netns "$nsb" ||
    { echo "test-netns: cannot create the veth pair"; exit 1; }
ip -n "$nsa" addr add "$ipa/24" dev "$va" && ip -n "$nsb" addr add "$ipb/24" dev "$vb" &&
    ip -n "$nsa" link set lo up && ip -n "$nsb" link set lo up &&
    ip -n "$nsa" link set "$va" up && ip -n "$nsb" link set "$vb" up ||
    { echo "test-netns: cannot configure the veth pair"; exit 1; }
# The plugin takes only running interfaces: wait for the carrier (bounded).
for i in $(seq 50); do
    ip -n "$nsa" link show "$va" | grep -q LOWER_UP &&
        ip -n "$nsb" link show "$vb" | grep -q LOWER_UP && break
    sleep 0.1
done
ip -n "$nsb" link show "$vb" | grep -q LOWER_UP ||
    { echo "test-netns: the veth pair has no carrier after 5 s"; exit 1; }

# in NS IFNAME CMD...: run CMD in a namespace with the plugin on that interface.
in_ns() {
    local ns=$1 ifname=$2
    shift 2
    ip netns exec "$ns" env NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME="=$ifname" \
        timeout -k 5 "$tmo" "$@"
}

# pair NAME SERVER_ARGS -- CLIENT_ARGS: server in A, client in B; sets src/crc.
pair() {
    local name=$1 sargs=() cargs=()
    shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do sargs+=("$1"); shift; done
    shift
    cargs=("$@")
    in_ns "$nsa" "$va" "$bench" --server "$port" --timeout 30 "${sargs[@]}" \
        >"$out/$name.server" 2>&1 &
    local spid=$!
    in_ns "$nsb" "$vb" "$bench" --client "$ipa:$port" --timeout 30 "${cargs[@]}" \
        >"$out/$name.client" 2>&1
    crc=$?
    wait "$spid"
    src=$?
    used=$port
    port=$((port + 1))   # no reuse within a run (TIME_WAIT)
}

check() { if "$@"; then return 0; fi; echo "FAILED: $*"; fails=$((fails + 1)); return 1; }
show() { sed "s/^/  $2| /" "$out/$1.$2"; }

# 1. The real run: 1 GiB, byte-exact.
t0=$(date +%s.%N)
pair exact -- --total "$total" --msg 4M --verify
t1=$(date +%s.%N)
show exact server
show exact client
check [ "$src" = 0 ] && check [ "$crc" = 0 ]
check grep -q "^# rail-bench (nccl-net-rail $(cat VERSION 2>/dev/null || echo)" "$out/exact.client"
check grep -q "^# transport: tcp, chosen because NCCL_RAIL_TRANSPORT=tcp" "$out/exact.client"
check grep -q "^# client (this side.*device 0 = $vb:$ipb" "$out/exact.client"
check grep -q "^# server ($ipa:$used, .*device 0 = $va:$ipa.*data address $ipa:" \
    "$out/exact.client"
check grep -q "^# client ($ipb:.*device 0 = $vb:$ipb" "$out/exact.server"
check grep -q "^rail-bench: verified: every byte right" "$out/exact.client"
check grep -q "^rail-bench: verified: every byte right" "$out/exact.server"
line=$(grep "^rail-bench: moved" "$out/exact.client")
echo "test-netns: $total byte-exact between namespaces: ${line#rail-bench: }" \
    "(wall $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s)"

# 2. It can fail: a byte flipped by the sender is caught, on both sides.
pair corrupt -- --total 64M --msg 1M --verify --corrupt 12345678
check [ "$src" = 1 ] && check [ "$crc" = 1 ] ||
    { show corrupt server; show corrupt client; }
check grep -q "DATA MISMATCH: 1 of the messages .* offset 12345678 " "$out/corrupt.client"
check grep -q "DATA MISMATCH at the peer: 1 wrong messages, first wrong byte at offset 12345678" \
    "$out/corrupt.server"

# 3. It can fail: nothing listens on the port.
in_ns "$nsb" "$vb" "$bench" --client "$ipa:$port" --timeout 2 --total 1M --msg 1M >"$out/refused" 2>&1
rc=$?
check [ "$rc" != 0 ] || cat "$out/refused"
check grep -q "cannot reach $ipa:$port: connection refused (is \`rail-bench --server $port\` running there" \
    "$out/refused" || cat "$out/refused"

# 4. The user's syntax is checked before anything else.
"$bench" --client "$ipa" >"$out/syntax" 2>&1
check [ $? = 2 ] || cat "$out/syntax"
check grep -q "expected HOST:PORT with a port number" "$out/syntax"
"$bench" --csv "$out/x.csv" --total 4M >"$out/syntax" 2>&1
check [ $? = 2 ] && check grep -q "csv writes the size sweep: it does not go with --total" \
    "$out/syntax"

# 5. --csv: each side writes the sweep (the client's sizes: 8, 64, 512 B), a header and one
# row per size with every figure, as many rows as the table has.
sweep=(-b 8 -e 512 -f 8 -t 0.01 -n 50)
pair csv --csv "$out/server.csv" -- "${sweep[@]}" --csv "$out/client.csv"
check [ "$src" = 0 ] && check [ "$crc" = 0 ] || { show csv server; show csv client; }
for side in server client; do
    check [ "$(head -n 1 "$out/$side.csv")" = "size_bytes,iters,lat_us,bw_gbs,lat_p50_us" ]
    check [ "$(tail -n +2 "$out/$side.csv" | cut -d, -f1 | tr '\n' ' ')" = "8 64 512 " ] ||
        cat "$out/$side.csv"
    check awk -F, 'NR > 1 && !(NF == 5 && $2 > 0 && $3 > 0 && $4 > 0 && $5 > 0) { exit 1 }' \
        "$out/$side.csv"
    check [ "$(grep -c '^ *[0-9]' "$out/csv.$side")" = 3 ]
done

if [ "$fails" -ne 0 ]; then
    echo "test-netns: $fails check(s) FAILED"
    exit 1
fi
echo "test-netns: all checks passed"
