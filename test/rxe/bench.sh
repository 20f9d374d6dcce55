#!/bin/bash
# rail-bench over the verbs transport side by side with perftest, in one
# guest boot, alternating run by run so that host noise hits both alike:
#   same:  one device, rxe0 to itself
#   cross: rxe1 (rail-bench's sender, perftest's client) to rxe0 (receiver,
#          server): one direction across the veth pair
#   test/rxe/run.sh --cmd test/rxe/bench.sh
#   test/rxe/run.sh --cmd test/rxe/bench.sh --env BENCH_ROUNDS=5 --env BENCH_MODES=same
# Environment: BENCH_ROUNDS (default 3), BENCH_MODES ("same cross"),
# RAIL_BENCH (rail-bench binaries, space separated, default build/rail-bench:
# several compare builds in one boot, e.g. "build/old/rail-bench build/rail-bench"),
# BENCH_BW_BYTES (bytes per bandwidth run, default 512 MiB: a few seconds each,
# rxe's rate swings from second to second), BENCH_WINDOW (rail-bench -W,
# default 32), BENCH_LAT_ITERS (round trips per latency run, default 20000:
# about a second, so that a burst of host noise does not decide a round),
# BENCH_NO_BW=1 (latency only: many short rounds, see "med2" below),
# BENCH_CPUS (A,B: pin perftest's server and rail-bench's parent to guest CPU
# A, perftest's client and rail-bench's forked peer to CPU B; default: no pinning).
# Prints perftest's and rail-bench's own lines, then one summary table:
# 8-byte latency (perftest's t_avg and t_typical against rail-bench's mean
# and median half round trip) and bandwidth in MB/s with rail-bench / perftest ratios, per round,
# and the median ratio per mode; "med2": the median rail-bench figure over
# the median perftest one. docs/PERFORMANCE.md keeps the figures.
set -uo pipefail
. "$RXE_HARNESS/lib.sh"
rounds=${BENCH_ROUNDS:-3}
modes=${BENCH_MODES:-same cross}
read -r -a rbs <<<"${RAIL_BENCH:-build/rail-bench}"
bw_bytes=${BENCH_BW_BYTES:-536870912}
lat_iters=${BENCH_LAT_ITERS:-20000}
window=${BENCH_WINDOW:-32}
pin_srv=() pin_cli=() pin_rb=()
if [ -n "${BENCH_CPUS:-}" ]; then
    pin_srv=(taskset -c "${BENCH_CPUS%,*}") pin_cli=(taskset -c "${BENCH_CPUS#*,}")
    pin_rb=(--cpus "$BENCH_CPUS")
fi
g0=$(rxe_ipv4_gid_index rxe0 "$RXE_IP0") || { echo "no IPv4 GID on rxe0"; exit 1; }
g1=$(rxe_ipv4_gid_index rxe1 "$RXE_IP1") || { echo "no IPv4 GID on rxe1"; exit 1; }
export NCCL_RAIL_TRANSPORT=ib
res=$(mktemp)
port=18700

# perftest: server on rxe0; client on rxe0 (same) or rxe1 (cross).
perf() { # MODE TOOL SIZE ITERS EXTRA...
    local mode=$1 tool=$2 size=$3 iters=$4 cdev=rxe0 cg=$g0
    shift 4
    [ "$mode" = cross ] && cdev=rxe1 cg=$g1
    port=$((port + 1))
    rxe_pair "$tool" $port 180 \
        "${pin_srv[@]}" "$tool" -d rxe0 -x "$g0" -p $port -s "$size" -n "$iters" -F "$@" -- \
        "${pin_cli[@]}" "$tool" -d "$cdev" -x "$cg" -p $port -s "$size" -n "$iters" -F "$@" "$RXE_IP0" |
        grep -E "client\| +$size +[0-9]+ "
}

# rail-bench: the parent (role A, device -d) sends in -B runs, the forked child (-D) receives.
rail() { # MODE BINARY ARGS...
    local mode=$1 rb=$2
    shift 2
    if [ "$mode" = cross ]; then
        # device 0 is rxe0: the parent (role A, the sender in -B runs) on rxe1
        NCCL_IB_HCA="=rxe0,rxe1" timeout 180 "$rb" -d 1 -D 0 "${pin_rb[@]}" "$@" | tail -1
    else
        NCCL_IB_HCA="=rxe0" timeout 180 "$rb" "${pin_rb[@]}" "$@" | tail -1
    fi
}

for round in $(seq 1 "$rounds"); do
    for mode in $modes; do
        for s in 65536 1048576; do
            [ "${BENCH_NO_BW:-0}" = 1 ] && break
            bw_iters=$((bw_bytes / s))
            line=$(perf "$mode" ib_write_bw $s "$bw_iters" --report_gbits)
            echo "$mode r$round $line"
            # BW average, Gb/s -> MB/s
            v=$(awk '{ print $(NF-1) * 1000 / 8 }' <<<"$line")
            echo "$mode $round bw$s perf ${v:-0}" >>"$res"
            for i in "${!rbs[@]}"; do
                line=$(rail "$mode" "${rbs[i]}" -B -b $s -e $s -W "$window" -n "$bw_iters" -t 60)
                echo "$mode r$round ${rbs[i]} bw $s: $line"
                v=$(awk '{ print $4 * 1000 }' <<<"$line")
                echo "$mode $round bw$s rail$i ${v:-0}" >>"$res"
            done
        done
        line=$(perf "$mode" ib_write_lat 8 "$lat_iters")
        echo "$mode r$round $line"
        # bytes iters t_min t_max t_typical t_avg ...
        read -r tt ta < <(awk '{ print $(NF-4), $(NF-3) }' <<<"${line#*|}")
        echo "$mode $round lat perf_avg ${ta:-0}" >>"$res"
        echo "$mode $round lat perf_typ ${tt:-0}" >>"$res"
        for i in "${!rbs[@]}"; do
            line=$(rail "$mode" "${rbs[i]}" -L -b 8 -e 8 -n $((4 * lat_iters)) -t 60)
            echo "$mode r$round ${rbs[i]} lat 8: $line"
            echo "$mode $round lat rail$i $(awk '{ print $3 }' <<<"$line")" >>"$res"
            echo "$mode $round lat p50rail$i $(awk '{ print $5 }' <<<"$line")" >>"$res"
        done
    done
done

echo "== summary (MB/s, us; ratio = rail-bench / perftest; latency ratio vs t_avg and t_typical)"
for i in "${!rbs[@]}"; do echo "   rail$i = ${rbs[i]}"; done
awk -v nr="${#rbs[@]}" '
{ v[$1 " " $2 " " $3 " " $4] = $5; m[$1] = 1; r[$2] = 1 }
function med(a, n,   i, j, t) {
    for (i = 1; i <= n; i++)
        for (j = i + 1; j <= n; j++)
            if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
END {
    printf "%-6s %-5s %-5s %8s %8s %8s %8s %6s %6s | %7s %7s %5s | %7s %7s %5s\n", "mode",
        "rail", "round", "lat_avg", "lat_typ", "rl_mean", "rl_p50", "x_avg", "x_typ",
        "64K_prf", "64K_rl", "ratio", "1M_prf", "1M_rl", "ratio"
    for (mo in m) for (b = 0; b < nr; b++) {
        n = 0
        for (ro = 1; (mo " " ro " lat rail" b) in v; ro++) {
            k = mo " " ro
            pa = v[k " lat perf_avg"]; pt = v[k " lat perf_typ"]; rl = v[k " lat rail" b]
            rm = v[k " lat p50rail" b]
            b1p = v[k " bw65536 perf"]; b1r = v[k " bw65536 rail" b]
            b2p = v[k " bw1048576 perf"]; b2r = v[k " bw1048576 rail" b]
            n++
            pts[n] = pt; rms[n] = rm
            xa[n] = pa > 0 ? rl / pa : 0; xt[n] = pt > 0 ? rm / pt : 0
            q1[n] = b1p > 0 ? b1r / b1p : 0; q2[n] = b2p > 0 ? b2r / b2p : 0
            printf "%-6s %-5s %-5d %8.2f %8.2f %8.2f %8.2f %6.2f %6.2f | %7.1f %7.1f %5.2f |",
                mo, "rail" b, ro, pa, pt, rl, rm, xa[n], xt[n], b1p, b1r, q1[n]
            printf " %7.1f %7.1f %5.2f\n", b2p, b2r, q2[n]
        }
        if (n)
            printf "%-6s %-5s %-5s %8s %8s %8s %8s %6.2f %6.2f | %7s %7s %5.2f | %7s %7s %5.2f\n",
                mo, "rail" b, "med", "", "", "", "", med(xa, n), med(xt, n), "", "", med(q1, n), "",
                "", med(q2, n)
        # the host swings between a fast and a slow state for seconds at a
        # time; a round whose two runs fell in different states gives a
        # ratio of either side of the truth. With many rounds, the ratio of
        # the two medians compares the same mixture of states.
        if (n) {
            mp = med(pts, n); mr = med(rms, n)
            printf "%-6s %-5s %-5s %8s %8.2f %8s %8.2f %6s %6.2f   (ratio of the medians over rounds)\n",
                mo, "rail" b, "med2", "", mp, "", mr, "", (mp > 0 ? mr / mp : 0)
        }
    }
}' "$res"
rm -f "$res"
