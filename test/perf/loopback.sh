#!/bin/bash
# rail-bench against raw loopback TCP with the same number of streams, in
# one run, alternating, on the machine it runs on (the CI machine kind:
# 2 cores). Prints each measurement and the ratio of the medians.
#   test/perf/loopback.sh [STREAMS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
streams=${1:-4} rounds=${2:-3}
make -s -j2 tools >/dev/null
export NCCL_SOCKET_IFNAME=lo NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_NTHREADS=$streams NCCL_NSOCKS_PERTHREAD=1
raw=() rail=() ipf=()
have_iperf=$(command -v iperf3 || true)
for r in $(seq "$rounds"); do
	raw+=("$(build/rail-rawtcp -P "$streams" -s 3 | sed -E 's/.*: ([0-9.]+) GB\/s.*/\1/')")
	# 64 MiB messages, 8 in flight, one connection of $streams streams, one way.
	rail+=("$(build/rail-bench -B -b 64M -e 64M -W 8 -n 40 -t 3 | tail -1 | awk '{print $4}')")
	if [ -n "$have_iperf" ]; then
		iperf3 -s -1 -p 5399 -D >/dev/null 2>&1; sleep 0.3
		ipf+=("$(iperf3 -c 127.0.0.1 -p 5399 -P "$streams" -t 3 -f g 2>/dev/null | awk '/SUM.*receiver/{print $6/8}')")
	fi
	echo "round $r: raw ${raw[-1]} GB/s, rail-bench ${rail[-1]} GB/s${have_iperf:+, iperf3 ${ipf[-1]} GB/s}"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
mr=$(median "${raw[@]}") ml=$(median "${rail[@]}")
echo "median: raw loopback $mr GB/s, rail-bench $ml GB/s with $streams streams: $(awk -v a="$ml" -v b="$mr" 'BEGIN{printf "%.0f%%", 100*a/b}') of raw"
