#!/bin/bash
# nccl-tests' other collectives on the GPU machine, through the plugin
# against NCCL Socket, NP ranks as NP NCCL nodes on the one GPU under
# MPS, ROUNDS alternating rounds; then one table per collective and rank
# count: the median out-of-place time (us) per size, and from 32 MiB the
# median busbw (GB/s).
#   test/nccl/colls-vs-socket.sh NCCL_TESTS_SRC [NP...]      (default NP: 2 4)
#   env: COLLS ("all_gather reduce_scatter alltoall sendrecv"), ROUNDS (3),
#        MODES ("socket rail"; also rail:VAR=V,VAR=V),
#        SIZES ("-b 8 -e 64M -f 8"), ITERS ("-w 5 -n 20"), OUT (build/colls)
set -uo pipefail
cd "$(dirname "$0")/../.."
R=$PWD
NTSRC=${1:?usage: colls-vs-socket.sh NCCL_TESTS_SRC [NP...]}
shift
nps=("$@")
[ ${#nps[@]} -gt 0 ] || nps=(2 4)
COLLS=${COLLS:-"all_gather reduce_scatter alltoall sendrecv"}
ROUNDS=${ROUNDS:-3} SIZES=${SIZES:-"-b 8 -e 64M -f 8"} ITERS=${ITERS:-"-w 5 -n 20"}
OUT=${OUT:-build/colls}
MODES=${MODES:-"socket rail"}
mode_tag() { printf '%s' "$1" | tr -c 'A-Za-z0-9_.=-' '_'; }
mkdir -p "$OUT"
(cd "$NTSRC" && make -j"$(nproc)" MPI=1 MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi NCCL_HOME=/usr \
	NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILDDIR=/tmp/nt >/tmp/nt.log 2>&1) ||
	{ tail -30 /tmp/nt.log; exit 4; }
make -s -j"$(nproc)" plugin || exit 5
export CUDA_MPS_PIPE_DIRECTORY=/tmp/rail-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/rail-mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d
trap 'echo quit | nvidia-cuda-mps-control' EXIT
status=0
for np in "${nps[@]}"; do
	for coll in $COLLS; do
		for round in $(seq "$ROUNDS"); do
			for mode in $MODES; do
				case ${mode%%:*} in
				rail) env=(-x NCCL_NET_PLUGIN="$R/build/libnccl-net-rail.so" -x NCCL_NET=Rail) ;;
				socket) env=(-x NCCL_NET_PLUGIN=none -x NCCL_NET=Socket) ;;
				esac
				if [[ $mode == *:* ]]; then
					IFS=, read -ra kv <<<"${mode#*:}"
					for v in "${kv[@]}"; do env+=(-x "$v"); done
				fi
				tag=$(mode_tag "$mode")
				# shellcheck disable=SC2086
				mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" \
					-x NCCL_NVLS_ENABLE=0 -x NCCL_TESTS_DEVICE=0 -x NCCL_SOCKET_IFNAME=lo \
					-x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY \
					-x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=INIT,NET "${env[@]}" \
					test/nccl/wrapper.sh "/tmp/nt/${coll}_perf" $SIZES $ITERS -g 1 -c 1 \
					>"$OUT/np$np-$coll-$tag-$round.out" 2>&1 || status=1
				grep -qE "Using network (Rail|Socket)" "$OUT/np$np-$coll-$tag-$round.out" ||
					{ echo "np$np $coll $mode $round: no 'Using network' line"; status=1; }
				grep -hE "Out of bounds values : [1-9]|FAILED" "$OUT/np$np-$coll-$tag-$round.out"
			done
		done
		python3 - "$OUT" "$np" "$coll" "$ROUNDS" $(for m in $MODES; do mode_tag "$m"; echo; done) <<'PY'
import statistics, sys
out, np_, coll, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
modes = sys.argv[5:]
def rows(path):
    r = {}
    for line in open(path, errors="replace"):
        f = line.split()
        if len(f) >= 9 and f[0].isdigit() and f[2] == "float":
            r[int(f[0])] = (float(f[5]), float(f[7]), f[8])
    return r
data = {m: [rows(f"{out}/np{np_}-{coll}-{m}-{k}.out") for k in range(1, rounds + 1)] for m in modes}
sizes = sorted(set().union(*[r.keys() for m in data for r in data[m]]))
print(f"## {coll}, {np_} ranks, medians of {rounds} rounds: time us (busbw GB/s)")
print("| size | " + " | ".join(modes) + " | " + " | ".join(f"{m}/{modes[0]}" for m in modes[1:]) + " |")
print("|---:" * (2 * len(modes)) + "|")
for s in sizes:
    cell = {}
    for m in data:
        t = [r[s][0] for r in data[m] if s in r]
        b = [r[s][1] for r in data[m] if s in r]
        cell[m] = (statistics.median(t), statistics.median(b)) if t else None
    if not all(cell.values()):
        continue
    fmt = lambda c: f"{c[0]:.1f}" + (f" ({c[1]:.2f})" if s >= (32 << 20) else "")
    ratios = [f"{cell[m][0] / cell[modes[0]][0]:.2f}" if cell[modes[0]][0] > 0 else "-" for m in modes[1:]]
    print(f"| {s} | " + " | ".join(fmt(cell[m]) for m in modes) + " | " + " | ".join(ratios) + " |")
PY
	done
done
exit $status
