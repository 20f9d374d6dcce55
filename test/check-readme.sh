#!/bin/sh
# nccl-net-rail: keep the README's parameter table equal to params.def.
#
#   test/check-readme.sh RAIL_INFO_BINARY            check (make test-readme)
#   test/check-readme.sh RAIL_INFO_BINARY --update   rewrite it (make readme)
#
# The table lives in README.md between the lines
#   <!-- params:begin -->
#   <!-- params:end -->
# and must equal the output of `RAIL_INFO_BINARY --config --markdown`
# (blank lines at the edges of the block are ignored). A check that finds
# a difference prints it as a diff and fails. RAIL_README=path checks
# another file than the README.md next to this directory.
# Exit status: 0 up to date (or updated), 1 differs, 2 usage or setup error.
set -eu

prog=check-readme
begin='<!-- params:begin -->'
end='<!-- params:end -->'

usage() {
	echo "usage: $0 RAIL_INFO_BINARY [--update]" >&2
	exit 2
}

bin=
update=0
for arg in "$@"; do
	case $arg in
	--update) update=1 ;;
	-h | --help) usage ;;
	-*) echo "$prog: unknown option $arg" >&2; usage ;;
	*)
		[ -z "$bin" ] || usage
		bin=$arg
		;;
	esac
done
[ -n "$bin" ] || usage

readme=${RAIL_README:-$(dirname "$0")/../README.md}

if [ ! -f "$readme" ]; then
	echo "$prog: $readme: no such file" >&2
	exit 2
fi
if [ ! -x "$bin" ]; then
	echo "$prog: $bin: not an executable (build it with 'make tools')" >&2
	exit 2
fi

nbegin=$(grep -c -x -F -e "$begin" "$readme" || true)
nend=$(grep -c -x -F -e "$end" "$readme" || true)
if [ "$nbegin" -ne 1 ] || [ "$nend" -ne 1 ]; then
	echo "$prog: $readme must contain the line '$begin' once and the line '$end'" \
		"once (found $nbegin and $nend)" >&2
	exit 2
fi
lbegin=$(grep -n -x -F -e "$begin" "$readme" | cut -d: -f1)
lend=$(grep -n -x -F -e "$end" "$readme" | cut -d: -f1)
if [ "$lbegin" -ge "$lend" ]; then
	echo "$prog: $readme: '$end' (line $lend) comes before '$begin' (line $lbegin)" >&2
	exit 2
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/check-readme.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

# Drop blank lines at the start and the end of a file.
trim() {
	awk 'NF { started = 1 } started { lines[++n] = $0 }
	     END { while (n > 0 && lines[n] ~ /^[ \t]*$/) n--; for (i = 1; i <= n; i++) print lines[i] }' "$1"
}

if ! "$bin" --config --markdown >"$tmp/raw" 2>"$tmp/err"; then
	echo "$prog: '$bin --config --markdown' failed:" >&2
	cat "$tmp/err" >&2
	exit 2
fi
trim "$tmp/raw" >"$tmp/generated"
if [ ! -s "$tmp/generated" ]; then
	echo "$prog: '$bin --config --markdown' printed nothing" >&2
	exit 2
fi
if grep -q -x -F -e "$begin" -e "$end" "$tmp/generated"; then
	echo "$prog: '$bin --config --markdown' printed a marker line" >&2
	exit 2
fi

if [ $((lend - lbegin)) -gt 1 ]; then
	sed -n "$((lbegin + 1)),$((lend - 1))p" "$readme" >"$tmp/block.raw"
else
	: >"$tmp/block.raw"
fi
trim "$tmp/block.raw" >"$tmp/block"

if cmp -s "$tmp/block" "$tmp/generated"; then
	echo "$prog: $readme parameter table is up to date"
	exit 0
fi

if [ $update -eq 0 ]; then
	echo "$prog: $readme parameter table differs from '$bin --config --markdown':" >&2
	diff -u --label "$readme (between the params markers)" \
		--label "$bin --config --markdown" "$tmp/block" "$tmp/generated" >&2 || true
	echo "$prog: run 'make readme' to refresh it" >&2
	exit 1
fi

{
	sed -n "1,${lbegin}p" "$readme"
	echo
	cat "$tmp/generated"
	echo
	sed -n "${lend},\$p" "$readme"
} >"$tmp/readme.new"
# Write in place: keeps the file's mode, owner and links.
cat "$tmp/readme.new" >"$readme"
echo "$prog: $readme parameter table updated"
