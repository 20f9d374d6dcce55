#!/bin/bash
# Which knob moves the 64 KiB-4 MiB all-reduce times, plugin against Socket,
# on the GPU machine. For each NP:MODES group, ROUNDS alternating rounds of
# every mode (allreduce-rounds.sh), then the table of medians
# (rounds-merge.py), then, once per transport, what NCCL chose at each
# size (algorithm, protocol, channels) from NCCL_DEBUG_SUBSYS=TUNING.
#   test/nccl/midsize-study.sh "2:socket rail rail:NCCL_RAIL_TCP_MIN_CHUNK=64k" "4:socket rail"
#   env: SIZES (default "-b 64K -e 4M -f 2"), ROUNDS (3), ITERS ("-w 10 -n 50"),
#        LOGS (default build/nccl-logs/midsize)
set -uo pipefail
cd "$(dirname "$0")/../.."
LOGS=${LOGS:-build/nccl-logs/midsize}
SIZES=${SIZES:-"-b 64K -e 4M -f 2"}
export ITERS=${ITERS:-"-w 10 -n 50"}
export ROUNDS=${ROUNDS:-3}
mkdir -p "$LOGS"
status=0
for group in "$@"; do
	np=${group%%:*}
	modes=${group#*:}
	LOGS=$LOGS MODES=$modes test/nccl/allreduce-rounds.sh "$np:$SIZES" >"$LOGS-np$np.rounds.txt" 2>&1 || status=1
	grep -E "threads in one rank|wrong|FAILED" "$LOGS-np$np.rounds.txt" | sort | uniq -c | sort -rn | head -5
	args=()
	for m in $modes; do args+=("${np}r $m@$LOGS:$np:$m"); done
	echo "## $np ranks, medians of $ROUNDS rounds, us"
	test/nccl/rounds-merge.py "${args[@]}"
	for t in socket rail; do
		RUN_DEBUG_SUBSYS=INIT,TUNING NP=$np SIZES="$SIZES" ITERS="-w 1 -n 1" \
			OUT="$LOGS/tuning-np$np" test/nccl/run.sh "$t" >"$LOGS/tuning-np$np-$t.txt" 2>&1 ||
			tail -5 "$LOGS/tuning-np$np-$t.txt"
		echo "## $np ranks $t: NCCL's choice per size"
		grep -hE "Bytes -> Algo" "$LOGS/tuning-np$np/${t}_.out" 2>/dev/null |
			sed -E 's/^.*NCCL INFO //; s/ time [0-9.]+//' | sort -u | sort -t' ' -k2,2n | head -12
		grep -c "Bytes -> Algo" "$LOGS/tuning-np$np/${t}_.out" || grep -m6 -i "tun" "$LOGS/tuning-np$np/${t}_.out"
		grep -hoE "TUNER/Plugin: .*|NET/Rail : tuner: .*" "$LOGS/tuning-np$np/${t}_.out" | sort | uniq -c
		grep -hoE "[0-9]+ coll channels, [0-9]+ collnet channels, [0-9]+ nvls channels, [0-9]+ p2p channels" \
			"$LOGS/tuning-np$np/${t}_.out" | sort | uniq -c | head -2
	done
done
exit $status
