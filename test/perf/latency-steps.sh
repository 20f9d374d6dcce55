#!/bin/bash
# One TCP message at a time through the plugin (rail-bench -L: half round
# trips, two local processes), sizes 8 KiB to 1 MiB, with each setting given
# run in turn for ROUNDS rounds; prints per size the median over the rounds
# of each run's median, and each step's growth next to what the added bytes
# cost at the bandwidth rail-bench measures for the larger size.
#   test/perf/latency-steps.sh [ROUNDS] [SETTING...]
# SETTING: default, or VAR=VALUE (e.g. NCCL_RAIL_TCP_DIRECT=0); default:
# "default NCCL_RAIL_TCP_DIRECT=0".
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-5}
shift || true
[ $# -gt 0 ] || set -- default NCCL_RAIL_TCP_DIRECT=0
make -s -j2 tools >/dev/null
export NCCL_SOCKET_IFNAME=lo NCCL_RAIL_TRANSPORT=tcp
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq "$rounds"); do
	for s in "$@"; do
		env=()
		[ "$s" = default ] || env=("$s")
		env "${env[@]}" build/rail-bench -b 8k -e 1M -n 2000 2>/dev/null |
			awk -v s="$s" '$1 ~ /^[0-9]+$/ { print s, $1, $5, $4 }' >>"$out"
	done
done
python3 - "$out" "$@" <<'PY'
import collections, statistics, sys
lat, bw = collections.defaultdict(list), collections.defaultdict(list)
for line in open(sys.argv[1]):
    s, size, p50, gbs = line.split()
    lat[s, int(size)].append(float(p50))
    bw[s, int(size)].append(float(gbs))
for s in sys.argv[2:]:
    print(f"# {s}: size, median p50 us, step us, added bytes at this size's bandwidth us")
    prev = None
    for size in sorted({k[1] for k in lat if k[0] == s}):
        m = statistics.median(lat[s, size])
        line = f"{size:>8} {m:8.1f}"
        if prev:
            b = statistics.median(bw[s, size]) * 1e9
            line += f" {m - prev[1]:+8.1f} {(size - prev[0]) / b * 1e6:8.1f}" if b else ""
        print(line)
        prev = (size, m)
PY
