#!/bin/bash
# rail-bench against raw loopback TCP with the same number of streams and
# the same amount of data per system call, in one run, alternating, on the
# machine it runs on (the CI machine kind has 2 cores).
#   test/perf/loopback.sh [STREAMS] [ROUNDS]
# rail-bench sends MSG-byte messages over one connection of STREAMS streams,
# so each stream moves MSG/STREAMS bytes per send/recv call; rail-rawtcp is
# run with that call size. Two sizes: 1 MiB and 16 MiB per call.
set -euo pipefail
cd "$(dirname "$0")/../.."
streams=${1:-4} rounds=${2:-3}
make -s -j2 tools >/dev/null
export NCCL_SOCKET_IFNAME=lo NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_NTHREADS=$streams NCCL_NSOCKS_PERTHREAD=1
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
for call in 1048576 16777216; do
	msg=$((call * streams)) raw=() rail=()
	for r in $(seq "$rounds"); do
		raw+=("$(build/rail-rawtcp -P "$streams" -l "$call" -s 3 | sed -E 's/.*: ([0-9.]+) GB\/s.*/\1/')")
		rail+=("$(build/rail-bench -B -b "$msg" -e "$msg" -W 8 -n 100000 -t 3 | tail -1 | awk '{print $4}')")
		echo "$((call >> 20)) MiB per call, round $r: raw ${raw[-1]} GB/s, rail-bench ${rail[-1]} GB/s"
	done
	mr=$(median "${raw[@]}") ml=$(median "${rail[@]}")
	echo "median, $streams streams, $((call >> 20)) MiB per call: raw $mr GB/s, rail-bench $ml GB/s:" \
		"$(awk -v a="$ml" -v b="$mr" 'BEGIN{printf "%.0f%%", 100*a/b}') of raw"
done
