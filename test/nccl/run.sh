#!/bin/bash
# NCCL end to end on the GPU machine: all-reduce through the plugin's TCP
# transport versus NCCL's own Socket transport, with two ranks as two NCCL
# "nodes" (distinct NCCL_HOSTID) on the one GPU under the CUDA MPS server.
#
#   test/nccl/run.sh [MODE...]        MODE: rail | railpkg | socket | rail:VAR=V,VAR=V
#   (rail: this build by its path; railpkg: NCCL_NET_PLUGIN=rail, the name
#   form, as an installed package is used)
#   env: NP (ranks, default 2), RPN (ranks per node, default 1),
#        NGPUS (GPUs to spread a node's ranks over, default 1),
#        MPS (1 = run under MPS, default 1), SIZES ("-b 8 -e 512M -f 4"),
#        ITERS ("-w 5 -n 20"), OUT (folder for logs; default build/nccl-logs),
#        RUN_DEBUG_SUBSYS (NCCL_DEBUG_SUBSYS, default INIT,NET,ENV),
#        RUN_NCCL_LIB (a folder with another libnccl.so, e.g. from build-nccl.sh)
# Each mode prints the driver's table; its NCCL log goes to $OUT/<mode>.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
NP=${NP:-2} RPN=${RPN:-1} NGPUS=${NGPUS:-1} MPS=${MPS:-1}
SIZES=${SIZES:-"-b 8 -e 512M -f 4"}
ITERS=${ITERS:-"-w 5 -n 20"}
OUT=${OUT:-build/nccl-logs}
mkdir -p "$OUT"
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(rail socket)

cuda=$(dirname "$(dirname "$(command -v nvcc)")")
make -s -j"$(nproc)" plugin
mpicc -O2 -std=c11 -D_GNU_SOURCE test/nccl/allreduce.c -I"$cuda/include" \
	-L"$cuda/lib64" -lcudart -lnccl -o build/nccl-allreduce
plugin=$PWD/build/libnccl-net-rail.so

if [ "$MPS" = 1 ]; then
	export CUDA_MPS_PIPE_DIRECTORY=/tmp/rail-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/rail-mps-log
	mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
	nvidia-cuda-mps-control -d
	trap 'echo quit | nvidia-cuda-mps-control' EXIT
fi

common=(-x NCCL_NVLS_ENABLE=0 -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS="${RUN_DEBUG_SUBSYS:-INIT,NET,ENV}"
	-x RAIL_TEST_RANKS_PER_NODE="$RPN" -x RAIL_TEST_NGPUS="$NGPUS"
	-x NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}")
[ "$MPS" = 1 ] && common+=(-x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY)
[ -n "${RUN_NCCL_LIB:-}" ] && common+=(-x LD_LIBRARY_PATH="$RUN_NCCL_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")

status=0
for mode in "${modes[@]}"; do
	name=${mode%%:*}
	extra=()
	if [[ $mode == *:* ]]; then
		IFS=, read -ra kv <<<"${mode#*:}"
		for v in "${kv[@]}"; do extra+=(-x "$v"); done
	fi
	case $name in
	rail) env=(-x NCCL_NET_PLUGIN="$plugin" -x NCCL_NET=Rail) ;;
	railpkg) env=(-x NCCL_NET_PLUGIN=rail -x NCCL_NET=Rail) ;;
	socket) env=(-x NCCL_NET_PLUGIN=none -x NCCL_NET=Socket) ;;
	*) echo "unknown mode $mode" >&2; exit 2 ;;
	esac
	tag=$(echo "$mode" | tr -c 'A-Za-z0-9_.-' '_')
	echo "=== $mode (np=$NP, ranks per node=$RPN, MPS=$MPS)"
	if ! mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$NP" "${common[@]}" "${env[@]}" \
		"${extra[@]}" test/nccl/wrapper.sh build/nccl-allreduce $SIZES $ITERS \
		>"$OUT/$tag.out" 2>"$OUT/$tag.log"; then
		status=1
		echo "FAILED: see $OUT/$tag.log"; tail -20 "$OUT/$tag.log"
	fi
	grep -v '^$' "$OUT/$tag.out" || true
	# Which network NCCL really used (no silent fallback).
	grep -hoE "Using network [A-Za-z]+|NET/Rail : nccl-net-rail[^;]*;[^;]*" "$OUT/$tag.log" \
		| sort | uniq -c || true
done
exit $status
