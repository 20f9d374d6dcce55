#!/bin/sh
# nccl-net-rail: the scale check (make test-scale). scale_bench opens 128
# pairs over each transport (TCP over loopback, verbs on the fake provider)
# with a short idle window, and every metric named in the limits file must
# stay within its bound: the baseline written there plus its margin. A
# metric over its bound fails the check with its name, the measured value
# and the bound.
#
#   test/scale/check.sh [BUILD]          (default build)
#
# SCALE_LIMITS=FILE   another limits file (default test/scale/limits)
# SCALE_N=N           pairs per transport (default 128: what the limits are for)
# SCALE_IDLE=S        idle window in seconds (default 3)
# SCALE_KV=FILE       check scale_bench's key=value lines in FILE instead of running it
set -eu

BUILD=${1:-build}
here=$(dirname "$0")
limits=${SCALE_LIMITS:-$here/limits}
n=${SCALE_N:-128}
idle=${SCALE_IDLE:-3}

[ -r "$limits" ] || { echo "scale check: cannot read the limits file $limits" >&2; exit 1; }
if [ -n "${SCALE_KV:-}" ]; then
	kv=$SCALE_KV
else
	kv=$(mktemp /tmp/rail-scale-check.XXXXXX)
	trap 'rm -f "$kv"' EXIT
	RAIL_FAKEVERBS_LIB=${RAIL_FAKEVERBS_LIB:-$BUILD/test/fakeverbs/libfakeverbs.so} \
		"$BUILD/test/scale/scale_bench" -T tcp,verbs -n "$n" -t "$idle" -k "$kv" || {
		echo "scale check: $BUILD/test/scale/scale_bench failed" >&2
		exit 1
	}
fi

# limits: TRANSPORT METRIC BASELINE MARGIN, MARGIN +P% (relative) or +X (absolute).
awk -v limits="$limits" -v n="$n" '
function fail(msg) { print "scale check: FAIL: " msg > "/dev/stderr"; bad = 1 }
FNR == NR {
	if ($0 ~ /^[ \t]*(#|$)/)
		next
	if (NF < 4 || $4 !~ /^\+[0-9.]+%?$/) {
		fail(limits ":" FNR ": want TRANSPORT METRIC BASELINE +P% or +X: " $0)
		next
	}
	m = substr($4, 2)
	bound = $4 ~ /%$/ ? $3 * (1 + substr(m, 1, length(m) - 1) / 100) : $3 + m
	nl++
	lt[nl] = $1; lm[nl] = $2; lb[nl] = bound; lw[nl] = $3 " " $4
	next
}
{
	delete kv
	for (i = 1; i <= NF; i++) {
		eq = index($i, "=")
		if (eq)
			kv[substr($i, 1, eq - 1)] = substr($i, eq + 1)
	}
	if (kv["n"] != n)
		next
	t = kv["transport"]
	rows[t] = 1
	for (i = 1; i <= nl; i++) {
		if (lt[i] != t)
			continue
		if (!(lm[i] in kv)) {
			fail(t ": no metric " lm[i] " in scale_bench output")
			continue
		}
		v = kv[lm[i]]
		checked++
		if (v + 0 > lb[i] + 0)
			fail(sprintf("%s %s = %s at %d pairs, over its bound %g (%s, %s)", t, lm[i], v, n,
				     lb[i], lw[i], limits))
		else
			printf "scale check: %s %s = %s (bound %g)\n", t, lm[i], v, lb[i]
	}
}
END {
	for (i = 1; i <= nl; i++)
		if (!(lt[i] in rows) && !(lt[i] in missing)) {
			missing[lt[i]] = 1
			fail("no " lt[i] " row at " n " pairs in scale_bench output")
		}
	if (!bad)
		printf "scale check: %d metrics within their bounds (%s)\n", checked, limits
	exit bad
}' "$limits" "$kv"
