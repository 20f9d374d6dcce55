#!/bin/bash
# One-sided RMA through the plugin on the GPU machine, NCCL 2.30.7: NP ranks
# as NP NCCL nodes (distinct NCCL_HOSTID) on the one GPU under MPS, every
# byte through the plugin's TCP transport and its RMA backend.
#
#   test/nccl/rma-gpu.sh STEP...
# STEP:
#   build       NCCL from NCCL_SRC into NCCL_DIR (test/nccl/build-nccl.sh),
#               nccl-tests from TESTS_SRC (alltoall_perf, all_reduce_perf,
#               against NCCL_DIR's headers), the plugin, rma-pingpong
#   gin         alltoall_perf -R 2 -D 3 over Rail (device API, pure GIN)
#   hybrid      alltoall_perf -R 2 -D 4 over Rail (LSA + GIN)
#   a2a-rail    alltoall_perf -D 0 over Rail (two-sided)
#   a2a-socket  alltoall_perf -D 0 over NCCL's Socket transport
#   pingpong    rma-pingpong over Rail (host API ncclPutSignal / ncclWaitSignal
#               against ncclSend / ncclRecv; -r: host RMA required; every
#               rank makes its first one-sided call together, which NCCL
#               2.30 needs: see rma_pingpong.c)
#   norma       NCCL_RAIL_RMA=0: alltoall -D 3 and rma-pingpong, to see the
#               fallback named and nothing crash
# env: NP (2), SIZES ("-b 8 -e 64M -f 4"), ITERS ("-w 5 -n 20"), LOGS (folder,
#      default build/rma-logs), NCCL_SRC (.carry/nccl-2.30.7.tgz), NCCL_DIR
#      (/tmp/nccl230), TESTS_SRC (.carry/nccl-tests.tgz), TESTS_DIR
#      (/tmp/nccl-tests), STEP_TIMEOUT (seconds per run, 150), TAR (a .tgz the
#      logs are packed into after each step), EXTRA ("-x VAR=V ..." for mpirun),
#      STACKS (seconds: a run still going then has every rank's threads' stacks
#      written to LOGS/<step>-np<NP>.stacks, through
#      build/test/nccl/stackdump.so preloaded; test/nccl/stackdump.c)
# Each run's stdout (the table and NCCL's log) goes to LOGS/<step>-np<NP>.out,
# its stderr to .log; the
# script prints the table and which backend served RMA and GIN (the log lines
# that show it ran over the plugin, or that NCCL fell back).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit
NP=${NP:-2}
SIZES=${SIZES:-"-b 8 -e 64M -f 4"}
ITERS=${ITERS:-"-w 5 -n 20"}
LOGS=${LOGS:-build/rma-logs}
NCCL_SRC=${NCCL_SRC:-.carry/nccl-2.30.7.tgz} NCCL_DIR=${NCCL_DIR:-/tmp/nccl230}
TESTS_SRC=${TESTS_SRC:-.carry/nccl-tests.tgz} TESTS_DIR=${TESTS_DIR:-/tmp/nccl-tests}
STEP_TIMEOUT=${STEP_TIMEOUT:-150}
mkdir -p "$LOGS" build
plugin=$PWD/build/libnccl-net-rail.so
tests=$TESTS_DIR/build
cuda=$(dirname "$(dirname "$(command -v nvcc)")")
mpi=/usr/lib/x86_64-linux-gnu/openmpi

tests_make() {
	make -C "$TESTS_DIR/src" -j"$(nproc)" MPI=1 MPI_HOME=$mpi NCCL_HOME="$NCCL_DIR" \
		BUILDDIR="$tests" NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" "$@" \
		"$tests/alltoall_perf" "$tests/all_reduce_perf"
}

build() {
	local t0=$SECONDS nccl_pid
	test/nccl/build-nccl.sh "$NCCL_SRC" "$NCCL_DIR" >"$LOGS/build-nccl.out" 2>&1 &
	nccl_pid=$!
	make -s -j4 plugin >"$LOGS/build-plugin.out" 2>&1 || { cat "$LOGS/build-plugin.out"; return 1; }
	rm -rf "$TESTS_DIR" && mkdir -p "$TESTS_DIR" && tar -xzf "$TESTS_SRC" -C "$(dirname "$TESTS_DIR")"
	# nccl-tests' objects need only NCCL's headers: compile them while NCCL
	# builds (its link fails until libnccl.so exists, and is redone below).
	while kill -0 $nccl_pid 2>/dev/null && [ ! -e "$NCCL_DIR/include/nccl_device.h" ]; do sleep 2; done
	sleep 5
	tests_make -k >"$LOGS/build-tests-early.out" 2>&1
	wait $nccl_pid || { tail -30 "$LOGS/build-nccl.out"; return 1; }
	echo "NCCL built in $((SECONDS - t0)) s: $(ls "$NCCL_DIR"/lib/libnccl.so.*.*)"
	tests_make >"$LOGS/build-tests.out" 2>&1 || { tail -30 "$LOGS/build-tests.out"; return 1; }
	mpicc -O2 -std=c11 -D_GNU_SOURCE test/nccl/rma_pingpong.c -I"$NCCL_DIR/include" \
		-I"$cuda/include" -L"$NCCL_DIR/lib" -L"$cuda/lib64" -lcudart -lnccl \
		-o build/rma-pingpong 2>"$LOGS/build-pingpong.out" ||
		{ cat "$LOGS/build-pingpong.out"; return 1; }
	echo "built in $((SECONDS - t0)) s: $(ls "$tests"/*_perf build/rma-pingpong | tr '\n' ' ')"
}

# Which backend served RMA and GIN, from a run's output (NCCL logs to stdout).
verdict() {
	grep -hoE "RMA/Plugin: (Loaded rma plugin [^ ]+ \(v[0-9]+\)|Assigned plugin [^ ]+ to comm|Failed to initialize any plugin)|GIN/Plugin: (Assigned plugin [^ ]+ type [0-9]+ to comm|Failed to initialize any GIN plugin)|ncclRmaProxyConnectOnce: rmaCommCount [0-9]+ rmaProxyCtxCount:[0-9]+|devCommCreate: creating [0-9]+ contexts: [0-9]+ GIN connections|Symmetric memory is not supported.*|This test requires GIN support.*|One sided RMA: host RMA is not supported.*|RMA \(ABI v[0-9]+\): .*|Using network [A-Za-z]+|NCCL version [0-9.+a-z]+|segfault|Segmentation fault|[^ ]*WARN.*" \
		"$@" | sort | uniq -c | sort -rn | head -25
}

mps_start() {
	export CUDA_MPS_PIPE_DIRECTORY=/tmp/rail-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/rail-mps-log
	mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
	nvidia-cuda-mps-control -d 2>/dev/null || true
	trap 'echo quit | nvidia-cuda-mps-control' EXIT
}

# run TAG NETMODE PROGRAM ARGS...; NETMODE rail | socket | rail-norma
run() {
	local tag=$1 mode=$2 rc t0=$SECONDS
	shift 2
	local env=(-x LD_LIBRARY_PATH="$NCCL_DIR/lib" -x NCCL_TESTS_DEVICE=0 -x NCCL_NVLS_ENABLE=0
		-x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY -x NCCL_DEBUG=INFO
		-x NCCL_DEBUG_SUBSYS=INIT,NET -x NCCL_SOCKET_IFNAME=lo)
	case $mode in
	rail | rail-norma)
		env+=(-x NCCL_NET_PLUGIN="$plugin" -x NCCL_NET=Rail -x NCCL_RMA_PLUGIN="$plugin"
			-x NCCL_GIN_TYPE=2 -x NCCL_RAIL_TRANSPORT=tcp)
		[ "$mode" = rail-norma ] && env+=(-x NCCL_RAIL_RMA=0) ;;
	socket) env+=(-x NCCL_NET_PLUGIN=none -x NCCL_NET=Socket) ;;
	esac
	local dumper=
	if [ -n "${STACKS:-}" ]; then
		make -s build/test/nccl/stackdump.so || return 1
		env+=(-x LD_PRELOAD="$PWD/build/test/nccl/stackdump.so")
		(sleep "$STACKS"; pids=$(pgrep -x "$(basename "$1" | cut -c1-15)")
		 [ -n "$pids" ] && test/nccl/stackdump.sh $pids >"$LOGS/$tag-np$NP.stacks" 2>&1) &
		dumper=$!
	fi
	# shellcheck disable=SC2086
	timeout -k 10 "$STEP_TIMEOUT" mpirun --allow-run-as-root --oversubscribe --bind-to none \
		-np "$NP" "${env[@]}" ${EXTRA:-} test/nccl/wrapper.sh "$@" \
		>"$LOGS/$tag-np$NP.out" 2>"$LOGS/$tag-np$NP.log"
	rc=$?
	[ -n "$dumper" ] && { kill $dumper 2>/dev/null; wait $dumper 2>/dev/null; }
	echo "=== $tag (np $NP, $mode): exit $rc after $((SECONDS - t0)) s: $*"
	grep -E "^ +[0-9]+ |Out of bounds|Avg bus|^#|rank [0-9]+:" "$LOGS/$tag-np$NP.out" |
		grep -vE "^#  (Using devices|  Rank|nThread|Rank )" | grep -v '^# *$' | head -60
	verdict "$LOGS/$tag-np$NP.out" "$LOGS/$tag-np$NP.log"
	[ $rc = 0 ] || tail -5 "$LOGS/$tag-np$NP.log"
	return $rc
}

a2a() { run "$1" "$2" "$tests/alltoall_perf" $SIZES $ITERS -g 1 -c 1 "${@:3}"; }

status=0
started=0
for step in "$@"; do
	if [ "$step" != build ] && [ $started = 0 ]; then mps_start; started=1; fi
	case $step in
	build) build ;;
	gin) a2a gin rail -R 2 -D 3 ;;
	hybrid) a2a hybrid rail -R 2 -D 4 ;;
	a2a-rail) a2a a2a-rail rail -D 0 ;;
	a2a-socket) a2a a2a-socket socket -D 0 ;;
	pingpong) run pingpong rail build/rma-pingpong $SIZES $ITERS -r ;;
	norma)
		# expected to fail: "This test requires GIN support"
		SIZES="-b 8 -e 1M -f 16" a2a norma-gin rail-norma -R 2 -D 3 || true
		SIZES="-b 8 -e 1M -f 16" run norma-pingpong rail-norma build/rma-pingpong \
			-b 8 -e 1M -f 16 $ITERS ;;
	*) echo "unknown step $step" >&2; false ;;
	esac || status=1
	[ -n "${TAR:-}" ] && tar -czf "$TAR" -C "$(dirname "$LOGS")" "$(basename "$LOGS")"
done
exit $status
