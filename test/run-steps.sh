#!/usr/bin/env bash
# make test's driver: run each make target in turn, like make -k (a failed
# step does not stop the next), then print how long each took and which failed.
#
#   test/run-steps.sh MAKE TARGET...
#
# Exit status: 0 when every step passed, 1 otherwise.
set -uo pipefail

make_cmd=$1
shift
t0=$SECONDS
failed=()
lines=()
for target in "$@"; do
	start=$SECONDS
	echo "== [$((SECONDS - t0))s] make $target"
	rc=0
	$make_cmd "$target" || rc=$?
	mark=""
	if [ "$rc" != 0 ]; then
		mark="  FAILED (exit $rc)"
		failed+=("$target")
	fi
	lines+=("$(printf '%6ds  %s%s' $((SECONDS - start)) "$target" "$mark")")
done
echo
echo "== make test: step times"
printf '%s\n' "${lines[@]}"
printf '%6ds  total\n' $((SECONDS - t0))
if [ "${#failed[@]}" != 0 ]; then
	echo "== make test: FAILED: ${failed[*]}"
	exit 1
fi
echo "== make test: all ${#lines[@]} steps passed"
