#!/bin/bash
# The TCP transport against NCCL Socket on the GPU machine, in one run so
# that every figure shares the machine (docs/PERFORMANCE.md):
#   test/nccl/tcp-vs-socket.sh      (logs and tables under $OUT or build/nccl-logs)
# 1. raw loopback TCP (rail-rawtcp) and the transport alone (rail-bench)
# 2. NCCL all-reduce 8 B..512 MiB: NCCL Socket vs the plugin, twice each,
#    alternating, under MPS, two ranks as two nodes on the one GPU
# 3. PyTorch all-reduce through the plugin
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-build/nccl-logs} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
mkdir -p "$OUT"
make -s -j"$(nproc)" plugin tools >/dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== raw loopback TCP"
for p in 1 2 4 8; do build/rail-rawtcp -P "$p" -s 2; done
build/rail-rawtcp -P 4 -x -s 2
echo "== rail-bench: 2 connections each way at once, 512 KiB, window 8 (NCCL's pattern)"
build/rail-bench -b 512k -e 512k -C 2 -x -W 8 -n 3000 -t 5 -B | tail -1
echo "== rail-bench: one connection, one way"
build/rail-bench -b 8 -e 256M -f 8 | tail -9
echo "== NCCL all-reduce"
SIZES="-b 8 -e 512M -f 2" test/nccl/run.sh socket rail socket rail >"$OUT/allreduce.txt" 2>&1
st=$?
grep -E "^===|^ +[0-9]+ |OK:|FAILED|Using network|NET/Rail : nccl-net-rail" "$OUT/allreduce.txt" \
	| sed -E 's/^vm:[0-9:]+ \[0\] NCCL INFO //' | uniq
echo "== PyTorch"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/rail-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/rail-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d
NCCL_NET_PLUGIN=$PWD/build/libnccl-net-rail.so NCCL_NET=Rail NCCL_NVLS_ENABLE=0 \
	NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET timeout 300 python3 test/nccl/torch_allreduce.py \
	>"$OUT/torch.txt" 2>&1
pt=$?
echo quit | nvidia-cuda-mps-control
grep -hE "wrong elements|Using network|Loaded net plugin" "$OUT/torch.txt" | sed -E 's/^[^ ]+ \[[0-9]\] NCCL INFO //' | sort | uniq -c
echo "allreduce exit $st, torch exit $pt"
exit $((st || pt))
