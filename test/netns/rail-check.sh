#!/bin/bash
# rail-check across "hosts": two network namespaces joined by three veth
# pairs, one for the rendezvous (control) and two data rails.
#
#   test/netns/rail-check.sh BUILD_DIR        (make test-netns)
#
# As root: namespaces rcA-<pid> / rcB-<pid>; control 10.77.92.1 <-> .2, rail
# 0 10.77.93.1 <-> .2, rail 1 10.77.94.1 <-> .2 (subnets that exist only
# inside them). The TCP transport uses the two rail interfaces
# (NCCL_SOCKET_IFNAME), the rendezvous the control one. Checks:
#   1. a healthy matrix: both rails pass, exit 0 on both sides, JSON ok;
#   2. rail 1 taken down in B mid-run (after the processes met, before the
#      pair tests: --hook): that pair named with host, NIC and GID, rail 0
#      still fine, exit 1 on both sides, within the time bound;
#   2b. a black hole on rail 1 (a wrong neighbour entry: no error, no answer):
#      the pair fails at --timeout, named;
#   2c. that run's heatmap (--svg): the SVG marks that pair failed and no other
#      (test/netns/heatmap-check.py), and a real browser draws it: chromium
#      --headless takes a screenshot, which must show the picture with the red
#      marker in those cells only (no chromium or python3: SKIP, saying so;
#      RAIL_NETNS_KEEP=DIR keeps the SVG and the screenshot there);
#   3. rail 1 down in B before the start: both ends drop it (no carrier),
#      --expect-devices names the missing device; B with one interface
#      configured, A two: the rail without a partner is named, exit 1;
#   4. a setting that must agree differs in a way TCP does not care about
#      (a note, exit 0), and the usage / setup errors exit 2.
# Everything is removed on every exit. Not root, or no `ip netns`: SKIP.
set -uo pipefail

build=${1:-build}
rc=$build/rail-check
nsa=rcA-$$ nsb=rcB-$$
out=$(mktemp -d /tmp/rail-check-netns.XXXXXX)
port=18891
fails=0

skip() { echo "SKIP: rail-check netns: $*"; exit 0; }
[ -x "$rc" ] || { echo "rail-check netns: $rc missing: run make" >&2; exit 1; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (run as root)"
command -v ip >/dev/null || skip "no ip(8) (package iproute2)"

cleanup() {
    ip netns del "$nsa" 2>/dev/null
    ip netns del "$nsb" 2>/dev/null
    rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$nsa" 2>"$out/err" || skip "ip netns add failed: $(cat "$out/err")"
ip netns add "$nsb" || { echo "rail-check netns: ip netns add $nsb failed"; exit 1; }
# veth NAME_A NAME_B SUBNET: a pair with .1 in A and .2 in B
veth() {
    ip link add "$1" netns "$nsa" type veth peer name "$2" netns "$nsb" &&
        ip -n "$nsa" addr add "$3.1/24" dev "$1" && ip -n "$nsb" addr add "$3.2/24" dev "$2" &&
        ip -n "$nsa" link set "$1" up && ip -n "$nsb" link set "$2" up
}
carrier() { ip -n "$1" link show "$2" | grep -q LOWER_UP; }
wait_carrier() {
    for _ in $(seq 50); do
        carrier "$nsa" rca0 && carrier "$nsa" rca1 && carrier "$nsb" rcb0 &&
            carrier "$nsb" rcb1 && return 0
        sleep 0.1
    done
    echo "rail-check netns: the veth pairs have no carrier after 5 s"; return 1
}
ip -n "$nsa" link set lo up && ip -n "$nsb" link set lo up &&
    veth rcac rcbc 10.77.92 && veth rca0 rcb0 10.77.93 && veth rca1 rcb1 10.77.94 &&
    wait_carrier || { echo "rail-check netns: cannot set up the namespaces"; exit 1; }

check() { if "$@"; then return 0; fi; echo "FAILED: $*"; fails=$((fails + 1)); return 1; }

# heatmap_screenshot SVG PNG: chromium draws SVG at its size into PNG, which
# heatmap-check.py reads back. Debian's chromium-headless-shell (the same
# renderer without the desktop parts) starts in a third of chromium's CPU time.
heatmap_screenshot() {
    local browser size t0=$SECONDS
    browser=$(command -v chromium-headless-shell || command -v chromium ||
        command -v chromium-browser || command -v google-chrome)
    if [ -z "$browser" ]; then
        echo "SKIP: rail-check netns: heatmap screenshot: no chromium to draw it" \
            "(apt-get install chromium-headless-shell, or chromium)"
        return 0
    fi
    size=$(sed -n 's/^<svg [^>]* width="\([0-9]*\)" height="\([0-9]*\)".*/\1,\2/p' "$1")
    # --no-sandbox: chromium refuses to run as root without it
    timeout -k 5 60 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars \
        --force-device-scale-factor=1 --no-first-run --disable-extensions \
        --user-data-dir="$out/chromium" --window-size="$size" --screenshot="$2" \
        "file://$1" >"$out/chromium.log" 2>&1
    check [ -s "$2" ] || { tail -5 "$out/chromium.log"; return 1; }
    check python3 test/netns/heatmap-check.py "$1" --fail "#0:rca1" "#1:rcb1" --rail 1 \
        --png "$2"
    echo "rail-check netns: heatmap drawn by ${browser##*/}" \
        "($("$browser" --version 2>/dev/null | tail -1)) and checked in $((SECONDS - t0)) s"
    if [ -n "${RAIL_NETNS_KEEP:-}" ]; then cp "$1" "$2" "$RAIL_NETNS_KEEP/"; fi
}
show() { sed "s/^/  $1| /" "$out/$1"; }

# run NAME [SERVER_ARGS] -- [CLIENT_ARGS]: A serves, B connects; sets src/crc/secs.
run() {
    local name=$1 sargs=() cargs=() t0=$SECONDS spid
    shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do sargs+=("$1"); shift; done
    shift
    cargs=("$@")
    ip netns exec "$nsa" env NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME="=rca0,rca1" \
        ${A_ENV:-} timeout -k 5 120 "$rc" --server "10.77.92.1:$port" --timeout 5 \
        --meet-timeout 30 "${sargs[@]}" >"$out/$name.a" 2>&1 &
    spid=$!
    ip netns exec "$nsb" env NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME="=rcb0,rcb1" \
        ${B_ENV:-} timeout -k 5 120 "$rc" --connect "10.77.92.1:$port" --timeout 5 \
        --meet-timeout 30 "${cargs[@]}" >"$out/$name.b" 2>&1
    crc=$?
    wait "$spid"
    src=$?
    secs=$((SECONDS - t0))
    port=$((port + 1))
    echo "rail-check netns: $name: server exit $src, client exit $crc, ${secs} s"
}

# 1. Healthy: both rails pass.
run healthy --
show healthy.a
check [ "$src" = 0 ] && check [ "$crc" = 0 ]
check grep -q "^# rail-check (nccl-net-rail $(cat VERSION))" "$out/healthy.a"
check grep -Eq "^[^ ]+#0:rca0 +\. +\. +[0-9.]+us [0-9.]+GB/s +- *$" "$out/healthy.a"
check grep -Eq "^[^ ]+#1:rcb1 +- +[0-9.]+us [0-9.]+GB/s +\. +\. *$" "$out/healthy.a"
check grep -q "^rail-check: all good: 2 device pair(s) tested, 0 failed" "$out/healthy.a"
check grep -q "^rail-check: rank 1 (.*): 2 device pair(s) tested here, 0 failed; all good" \
    "$out/healthy.b"
run json --json --
check [ "$src" = 0 ] && check [ "$crc" = 0 ]
if command -v python3 >/dev/null; then
    check python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ok"] is True and d["failures"] == 0, d
assert len(d["pairs"]) == 4 and all(p["ok"] for p in d["pairs"]), d["pairs"]
assert d["ranks"][1]["devices"][1]["gid"] == "10.77.94.2", d["ranks"][1]
' "$out/json.a" || show json.a
fi

# 2. Rail 1 goes down in B after the processes met: that pair fails, named, in bounded time.
run middown --hook "ip -n $nsb link set rcb1 down" --
show middown.a
check [ "$src" = 1 ] && check [ "$crc" = 1 ]
check grep -Eq "^[^ ]+#0:rca0 +\. +\. +[0-9.]+us [0-9.]+GB/s +- *$" "$out/middown.a"
check grep -Eq "^[^ ]+#0:rca1 +\. +\. +- +FAIL\(connect\) *$" "$out/middown.a"
check grep -q "^  try: check the link and the route between these two addresses" "$out/middown.a"
check grep -Eq "^FAIL [^ ]+#0:rca1 \(GID 10\.77\.94\.1\) <-> [^ ]+#1:rcb1 \(GID 10\.77\.94\.2\): connect: " \
    "$out/middown.a"
check grep -q "^rail-check: FAILED: 2 device pair(s) tested, 1 failed" "$out/middown.a"
check [ "$secs" -lt 60 ]
ip -n "$nsb" link set rcb1 up && wait_carrier || { echo "cannot bring rcb1 back"; exit 1; }

# 2b. A silent black hole on rail 1 (A's frames for B's rail-1 address go to a MAC nobody
# has): nothing errors, the connect step must end at --timeout with the pair named.
run blackhole --svg "$out/blackhole.svg" \
    --hook "ip -n $nsa neigh replace 10.77.94.2 lladdr 02:00:00:00:00:99 dev rca1 nud permanent" --
check [ "$src" = 1 ] && check [ "$crc" = 1 ] || show blackhole.a
check grep -Eq "^FAIL [^ ]+#0:rca1 \(GID 10\.77\.94\.1\) <-> [^ ]+#1:rcb1 \(GID 10\.77\.94\.2\): connect: .*nothing within 5 s" \
    "$out/blackhole.a" || show blackhole.a
check grep -q "^rail-check: FAILED: 2 device pair(s) tested, 1 failed" "$out/blackhole.a"
check [ "$secs" -lt 60 ]
ip -n "$nsa" neigh del 10.77.94.2 dev rca1 || { echo "cannot remove the neighbour entry"; exit 1; }

# 2c. The heatmap of 2b: rail 1's pair, and only it, marked failed; drawn by a real browser.
check grep -q "^rail-check: the heatmap is in $out/blackhole.svg" "$out/blackhole.a"
if ! command -v python3 >/dev/null; then
    echo "SKIP: rail-check netns: heatmap: no python3 to read the SVG and the screenshot"
elif check python3 test/netns/heatmap-check.py "$out/blackhole.svg" --fail "#0:rca1" "#1:rcb1" \
        --rail 1 --cells 8; then
    heatmap_screenshot "$out/blackhole.svg" "$out/heatmap.png"
fi

# 3. Rail 1 down in B before the start: both ends lose that interface (no carrier), so
# only --expect-devices can tell; and B configured with one interface only: the rail
# without a partner is named.
ip -n "$nsb" link set rcb1 down
for _ in $(seq 50); do carrier "$nsa" rca1 || break; sleep 0.1; done
run before --expect-devices 2 --
show before.a
check [ "$src" = 1 ] && check [ "$crc" = 1 ]
check grep -q "^FAIL devices: .* (rank 0) has 1 device(s), --expect-devices 2" "$out/before.a"
check grep -q "^FAIL devices: .* (rank 1) has 1 device(s), --expect-devices 2" "$out/before.a"
check grep -q "^rail-check: FAILED: 1 device pair(s) tested, 0 failed; 2 other problem" \
    "$out/before.a"
ip -n "$nsb" link set rcb1 up && wait_carrier || { echo "cannot bring rcb1 back"; exit 1; }
B_ENV="NCCL_SOCKET_IFNAME==rcb0" run onerail --
check [ "$src" = 1 ] && check [ "$crc" = 1 ]
check grep -q "^FAIL rail: .* (rank 0) has 2 device(s), .* (rank 1) 1: the rails beyond 1 have no partner" \
    "$out/onerail.a" || show onerail.a

# 4. A setting the TCP handshake negotiates differs: a note, not a failure.
B_ENV="NCCL_RAIL_TCP_INLINE=2048" run note --
check [ "$src" = 0 ] && check [ "$crc" = 0 ]
check grep -q "^note config: NCCL_RAIL_TCP_INLINE differs: .* on .* (rank 0), 2048 on .* (rank 1)" \
    "$out/note.a" || show note.a

# Setup errors exit 2: bad options, and nobody arriving.
"$rc" --server 1 --connect x:1 >"$out/usage" 2>&1
check [ $? = 2 ] && check grep -q "give one of --server, --connect or --rendezvous" "$out/usage"
ip netns exec "$nsa" env NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME="=rca0" \
    timeout 30 "$rc" --server "$port" --meet-timeout 1 >"$out/alone" 2>&1
check [ $? = 2 ] && check grep -q "only 1 of the 2 processes arrived within 1 s" "$out/alone"
"$rc" --server "$port" --svg /nonexistent/heatmap.svg >"$out/nosvg" 2>&1
check [ $? = 2 ] &&
    check grep -q "^rail-check: --svg /nonexistent/heatmap.svg: cannot write it: No such" "$out/nosvg"
env -u OMPI_COMM_WORLD_RANK -u SLURM_PROCID -u PMI_RANK -u PMIX_RANK \
    "$rc" --rendezvous "10.0.0.1:$port" >"$out/norank" 2>&1
check [ $? = 2 ] && check grep -q "needs the launcher's rank" "$out/norank"

if [ "$fails" -ne 0 ]; then
    echo "rail-check netns: $fails check(s) FAILED"
    exit 1
fi
echo "rail-check netns: all checks passed"
