#!/bin/bash
# NCCL all-reduce on the GPU machine, through the plugin against NCCL Socket,
# NP ranks as NP NCCL nodes on the one GPU under MPS, three alternating runs
# per transport, with the most threads any rank process had while each run
# went (sampled every 0.2 s from /proc/PID/task).
#   test/nccl/allreduce-rounds.sh NP[:SIZES] ...   e.g. 2:"-b 8 -e 512M -f 2" 4
#   env: MODES (default "socket rail"), ROUNDS (3), ITERS (run.sh's), LOGS
#   (folder, default build/nccl-logs/pool). Each run's table and log go to
#   LOGS/np<NP>-<mode>-<round>.{out,log}; LOGS/threads.txt has the counts.
#   Tables (medians of the rounds): test/nccl/rounds-merge.py LABEL@LOGS:NP:MODE ...
set -uo pipefail
cd "$(dirname "$0")/../.."
LOGS=${LOGS:-build/nccl-logs/pool}
MODES=${MODES:-"socket rail"} ROUNDS=${ROUNDS:-3}
mkdir -p "$LOGS"
make -s -j"$(nproc)" plugin tools >/dev/null

watch_threads() {
	local max=0 n p
	while :; do
		for p in $(pgrep -x nccl-allreduce); do
			n=$(ls "/proc/$p/task" 2>/dev/null | wc -l)
			[ "$n" -gt "$max" ] && max=$n
		done
		echo "$max" >"$1"
		sleep 0.2
	done
}

status=0
for spec in "$@"; do
	np=${spec%%:*}
	sizes="-b 8 -e 512M -f 4"
	[[ $spec == *:* ]] && sizes=${spec#*:}
	for round in $(seq "$ROUNDS"); do
		for mode in $MODES; do
			tag=np$np-$(echo "$mode" | tr -c 'A-Za-z0-9_.-' '_')-$round
			watch_threads "$LOGS/$tag.threads" &
			wpid=$!
			NP=$np SIZES="$sizes" OUT="$LOGS/run-$tag" test/nccl/run.sh "$mode" \
				>"$LOGS/$tag.out" 2>&1 || status=1
			kill "$wpid"; wait "$wpid" 2>/dev/null
			cp "$LOGS"/run-"$tag"/*.log "$LOGS/$tag.log" 2>/dev/null
			echo "$tag: max $(cat "$LOGS/$tag.threads") threads in one rank process;" \
				"$(grep -oE '[0-9]+ coll channels' "$LOGS/$tag.out" | sort | uniq -c | head -1)" \
				| tee -a "$LOGS/threads.txt"
			grep -hoE "FAILED.*|[0-9]+ wrong elements|at most [0-9]+ helper threads per process \([^)]*\)" \
				"$LOGS/$tag.out" "$LOGS/$tag.log" \
				| sed -E 's/.*NCCL INFO //' | sort | uniq -c | head -3
		done
	done
done
exit $status
