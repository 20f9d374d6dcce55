#!/bin/bash
# GPU machine: NCCL's example profiler plugin records this
# plugin's network events (TCP transport), and the cost of the profiler
# hooks with no profiler loaded, against an older build of the plugin.
#
#   test/nccl/profiler.sh PROFILER_SRC NCCL_TESTS_SRC [OLD_SRC_TGZ]
# PROFILER_SRC: NCCL's example profiler (plugins/profiler/example of the
# NCCL release installed, with its nccl/ headers); NCCL_TESTS_SRC:
# nccl-tests. Both are fetched beside the project, never committed.
# OLD_SRC_TGZ: `git archive --prefix=old/ COMMIT | gzip` of the build to
# compare against (optional). Writes to $OUT (default build/profiler):
# the profiler's JSON traces (prof/), all_reduce_perf's output, and the
# alternating cost runs (cost-small.txt, cost-large.txt; COST_ROUNDS
# alternations, default 3, COST_ITERS calls per small size, COST_LARGE=0
# skips the large sizes).
set -uo pipefail
cd "$(dirname "$0")/../.."
R=$PWD
PSRC=$(cd "$1" && pwd) NTSRC=$(cd "$2" && pwd) OLD=${3:-}
OUT=${OUT:-build/profiler}
mkdir -p "$OUT/prof"
OUT=$(cd "$OUT" && pwd)
cuda=$(dirname "$(dirname "$(command -v nvcc)")")
(cd "$PSRC" && g++ -O2 -Inccl -I"$cuda/include" -fPIC -shared -o /tmp/libnccl-profiler-example.so ./*.cc) || exit 3
(cd "$NTSRC" && make -j"$(nproc)" MPI=1 MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi NCCL_HOME=/usr \
	NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILDDIR=/tmp/nt >/tmp/nt.log 2>&1) ||
	{ tail -30 /tmp/nt.log; exit 4; }
make -s -j"$(nproc)" plugin || exit 5
if [ -n "$OLD" ]; then
	rm -rf /tmp/oldsrc && mkdir -p /tmp/oldsrc && tar -C /tmp/oldsrc -xzf "$OLD" &&
		make -s -C /tmp/oldsrc/old -j"$(nproc)" plugin || exit 6
fi

export CUDA_MPS_PIPE_DIRECTORY=/tmp/rail-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/rail-mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d
# 1. The example profiler with net plugin events (mask: ProxyOp 8 + ProxyStep 16 + NetPlugin 128).
cmd=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2
	-x NCCL_NVLS_ENABLE=0 -x NCCL_TESTS_DEVICE=0 -x NCCL_SOCKET_IFNAME=lo
	-x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY
	-x NCCL_NET_PLUGIN="$R/build/libnccl-net-rail.so" -x NCCL_NET=Rail
	-x NCCL_PROFILER_PLUGIN=/tmp/libnccl-profiler-example.so
	-x NCCL_PROFILE_EVENT_MASK=152 -x NCCL_PROFILE_DUMP_FILE="$OUT/prof/trace"
	-x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=INIT,NET,ENV
	test/nccl/wrapper.sh /tmp/nt/all_reduce_perf -b 64K -e 4M -f 4 -g 1 -w 1 -n 2)
echo "${cmd[*]}" >"$OUT/prof-command.txt"
"${cmd[@]}" >"$OUT/prof-run.out" 2>"$OUT/prof-run.log"
echo "profiler run: exit $?"
grep -hE "Loaded net plugin|Using network|rofiler" "$OUT/prof-run.log" | sort | uniq -c | head
grep -v '^#' "$OUT/prof-run.out" | grep -v '^$' | head -12
for f in "$OUT"/prof/*; do
	echo "$f: $(grep -o '"name": *"[A-Za-z ]*"' "$f" | sort | uniq -c | tr '\n' ' ')"
done
# The first net plugin events with what precedes them (their proxy step), then the traces packed.
f=$(ls "$OUT"/prof/* | head -1)
[ -n "$f" ] && grep -n -m3 -B10 -A4 '"Sock"\|"IB"' "$f" >"$OUT/prof-excerpt.txt"
tar -C "$OUT" -czf "$OUT/prof-traces.tgz" prof && rm -rf "$OUT/prof"
echo quit | nvidia-cuda-mps-control
sleep 1
[ -z "$OLD" ] && exit 0
# 2. Cost with no profiler plugin: old and new builds alternating.
modes=()
for _ in $(seq "${COST_ROUNDS:-3}"); do modes+=("rail:NCCL_NET_PLUGIN=/tmp/oldsrc/old/build/libnccl-net-rail.so" rail); done
OUT="$OUT/cost-small" SIZES="-b 8 -e 1M -f 8" ITERS="-w 50 -n ${COST_ITERS:-1000}" test/nccl/run.sh "${modes[@]}" \
	>"$OUT/cost-small.txt" 2>&1
[ "${COST_LARGE:-1}" = 1 ] && OUT="$OUT/cost-large" SIZES="-b 64M -e 256M -f 2" ITERS="-w 3 -n 20" test/nccl/run.sh "${modes[@]}" \
	>"$OUT/cost-large.txt" 2>&1
echo "cost runs done"
