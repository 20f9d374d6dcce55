#!/bin/bash
# What loopback TCP itself can carry on the machine it runs on: the ceiling
# of the plugin's all-reduce figures at >= 32 MiB. In an n-rank ring
# all-reduce every rank sends and receives busbw bytes/s at once, over one
# stream to its next rank per channel, so the host's loopback carries
# n x busbw in total: n x 3 x Socket's busbw GB/s of raw loopback for an
# n-rank all-reduce at 3x Socket.
# rail-rawtcp moves data one way over P streams (a sender and a receiver
# thread each, in two processes), as many streams as the ring has links.
#   test/nccl/loopback-ceiling.sh [STREAMS...]   (default 2 4 8 16)
#   env: CALL (bytes per send/recv call, default 524288: NCCL's Simple step
#        at 4 MiB buffers), SECONDS_EACH (3), ROUNDS (3)
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s -j"$(nproc)" tools >/dev/null
call=${CALL:-524288} secs=${SECONDS_EACH:-3} rounds=${ROUNDS:-3}
spin=${SPIN:-0} spinners=()
for _ in $(seq "$spin"); do
	bash -c 'while :; do :; done' &
	spinners+=($!)
done
trap '[ ${#spinners[@]} -eq 0 ] || kill "${spinners[@]}" 2>/dev/null' EXIT
echo "# $(nproc) CPUs, $spin busy; $call bytes per call, $secs s per run, median of $rounds"
[ $# -gt 0 ] || set -- 2 4 8 16
for p in "$@"; do
	v=()
	for r in $(seq "$rounds"); do
		v+=("$(build/rail-rawtcp -P "$p" -l "$call" -s "$secs" |
			sed -E 's/.*: ([0-9.]+) GB\/s.*/\1/')")
	done
	echo "streams $p: $(printf '%s\n' "${v[@]}" | sort -g |
		awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}') GB/s (runs: ${v[*]})"
done
