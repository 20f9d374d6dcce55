#!/usr/bin/env bash
# make test's driver: run each make target in turn, like make -k (a failed
# step does not stop the next), then print how long each took and which failed.
# Each step's output also goes to a log (RUN_STEPS_LOGS, default a temporary
# folder); after the table, each failed step's last lines that name a failure
# (RUN_STEPS_TAIL of them, 15; its last lines when none does) are printed
# again, so that a CI view that keeps only the end of the output shows why.
#
#   test/run-steps.sh MAKE TARGET...
#
# Exit status: 0 when every step passed, 1 otherwise.
set -uo pipefail

make_cmd=$1
shift
t0=$SECONDS
logs=${RUN_STEPS_LOGS:-$(mktemp -d /tmp/run-steps.XXXXXX)}
mkdir -p "$logs"
tail_n=${RUN_STEPS_TAIL:-15}
why='FAIL|ERROR|[Ee]rror|Sanitizer|Assert|assert|timed out|Segmentation|Aborted|Killed|^== '
failed=()
lines=()
for target in "$@"; do
	start=$SECONDS
	echo "== [$((SECONDS - t0))s] make $target"
	rc=0
	$make_cmd "$target" 2>&1 | tee "$logs/$target.log" || rc=$?
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
	for target in "${failed[@]}"; do
		echo
		echo "== make $target failed; why (whole output: $logs/$target.log):"
		{ grep -E "$why" "$logs/$target.log" || tail -n "$tail_n" "$logs/$target.log"; } |
			tail -n "$tail_n"
	done
	echo "== make test: FAILED: ${failed[*]}"
	exit 1
fi
echo "== make test: all ${#lines[@]} steps passed"
