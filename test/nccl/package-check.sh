#!/bin/bash
# The package on the GPU machine (Ubuntu, NCCL 2.28): the .deb
# built on Debian 12 (make deb, carried as build/pkg) installed with dpkg,
# then NCCL and PyTorch load the plugin by name (NCCL_NET_PLUGIN=rail), with
# no path, LD_LIBRARY_PATH or ldconfig step.
#   test/nccl/package-check.sh       (logs under $OUT or build/nccl-logs)
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-build/nccl-logs} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
mkdir -p "$OUT"
. /etc/os-release && echo "host: $PRETTY_NAME, $(ldd --version | head -n1)"
deb=$(ls build/pkg/nccl-net-rail_*_amd64.deb | head -n1)
dpkg -i "$deb" >"$OUT/dpkg.txt" 2>&1 || { cat "$OUT/dpkg.txt"; exit 1; }
echo "installed $deb"
rail-info --version
NCCL_NET_PLUGIN=rail rail-info --check; echo "rail-info --check exit $?"
NCCL_NET_PLUGIN=rail rail-info | grep -A2 "^Net plugin"
echo "== NCCL all-reduce, plugin by name"
SIZES="-b 8 -e 64M -f 8" ITERS="-w 5 -n 20" test/nccl/run.sh socket railpkg socket railpkg \
	>"$OUT/allreduce-pkg.txt" 2>&1
st=$?
grep -E "^===|^ +[0-9]+ |OK:|FAILED|Using network|NET/Rail : nccl-net-rail|Loaded net plugin" \
	"$OUT/allreduce-pkg.txt" | sed -E 's/^[^ ]+ \[[0-9]\] NCCL INFO //' | uniq
echo "== PyTorch, plugin by name"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/rail-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/rail-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d
NCCL_NET_PLUGIN=rail NCCL_NET=Rail NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
	timeout 300 python3 test/nccl/torch_allreduce.py >"$OUT/torch-pkg.txt" 2>&1
pt=$?
echo quit | nvidia-cuda-mps-control
grep -hE "wrong elements|Using network|Loaded net plugin|NET/Rail.*WARN|finalize" "$OUT/torch-pkg.txt" |
	sed -E 's/^[^ ]+ \[[0-9]\] NCCL INFO //' | sort | uniq -c
echo "allreduce exit $st, torch exit $pt"
exit $((st || pt))
