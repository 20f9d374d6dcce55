#!/bin/sh
# nccl-net-rail: keep a transport's files layered one way (make test-layering).
#
#   test/check-layering.sh [-t TABLE] OBJECT...
#
# OBJECTs are those of one source folder, src/ib/, src/tcp/ or src/rma/
# (make passes build/obj/src/ib/*.o of the sources there now, so a stale
# object of a removed file does not count). TABLE (default src/ib/ib.h;
# src/tcp/tcp.h for src/tcp/, src/rma/rma_tcp.h for src/rma/) holds the
# layer table, in its header comment, one line per file:
#    *  RANK  FILE  what it is
# RANK is LAYER.STEP (1.0, 1.1, ...), FILE a source name without ".c". A
# file may use a symbol (function or data) defined by another file of the
# folder only if the other file's rank is lower; calls between files of
# equal rank, or upward, are allowed only where the table says so:
#    *  allow  CALLER -> CALLEE  why
# The check reads `nm` of every OBJECT: each undefined symbol of a file
# that another file there defines is one use. It fails naming every
# violation (caller, callee, ranks, symbol), a file with no rank, and a
# ranked file with no object (a stale table).
# Exit status: 0 layered, 1 violations, 2 usage or setup error.
set -eu

prog=check-layering
usage() { echo "usage: $0 [-t TABLE] OBJECT..." >&2; exit 2; }
table=$(dirname "$0")/../src/ib/ib.h
if [ "${1:-}" = -t ]; then
	[ $# -ge 2 ] || usage
	table=$2
	shift 2
fi
[ $# -ge 1 ] || usage
NM=${NM:-nm}

[ -r "$table" ] || { echo "$prog: $table: cannot read the layer table" >&2; exit 2; }
for o in "$@"; do
	[ -r "$o" ] || { echo "$prog: $o: no such object (build first)" >&2; exit 2; }
done

# The folder, for messages: build/obj/src/ib/ib_qp.o -> src/ib.
dir=$(dirname "$1")
case $dir in */obj/*) dir=${dir#*/obj/} ;; esac

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

# The table: "FILE RANK" and "CALLER CALLEE" (allowed exceptions).
sed -n 's/^ \*  *\([0-9][0-9]*\.[0-9][0-9]*\)  *\([a-z][a-z0-9_]*\)  .*/\2 \1/p' "$table" \
	| sort >"$tmp/ranks"
sed -n 's/^ \*  *allow  *\([a-z][a-z0-9_]*\) *-> *\([a-z][a-z0-9_]*\).*/\1 \2/p' "$table" \
	| sort >"$tmp/allow"
[ -s "$tmp/ranks" ] || { echo "$prog: no layer table in $table" >&2; exit 2; }

# Definitions "SYMBOL FILE" and uses "SYMBOL FILE".
: >"$tmp/defs"
: >"$tmp/uses"
for o in "$@"; do
	f=$(basename "$o" .o)
	"$NM" -g --defined-only "$o" | awk -v f="$f" 'NF == 3 { print $3, f }' >>"$tmp/defs"
	"$NM" -u "$o" | awk -v f="$f" '{ print $NF, f }' >>"$tmp/uses"
	echo "$f" >>"$tmp/files"
done

status=0
# Files without a rank, ranks without a file.
for f in $(sort "$tmp/files"); do
	grep -q "^$f " "$tmp/ranks" || {
		echo "$prog: $dir/$f.c has no rank in $table's layer table"
		status=1
	}
done
while read -r f r; do
	grep -qx "$f" "$tmp/files" || {
		echo "$prog: $table ranks $f ($r) but no $f.o was given (stale table?)"
		status=1
	}
done <"$tmp/ranks"

# Every use of another file's symbol: CALLER CALLEE SYMBOL.
sort -k1,1 "$tmp/defs" >"$tmp/defs.s"
sort -k1,1 "$tmp/uses" | join "$tmp/defs.s" - | awk '$2 != $3 { print $3, $2, $1 }' \
	| sort -u >"$tmp/edges"

awk -v prog="$prog" '
	FILENAME == ARGV[1] { rank[$1] = $2; next }
	FILENAME == ARGV[2] { allow[$1 " " $2] = 1; next }
	{
		c = $1; d = $2; s = $3
		if (!(c in rank) || !(d in rank))
			next	# reported above
		if (rank[c] + 0 > rank[d] + 0 || ((c " " d) in allow))
			next
		printf "%s: %s (%s) -> %s (%s): %s: %s\n", prog, c, rank[c], d, rank[d], s,
		       rank[c] + 0 == rank[d] + 0 ? "same rank, not allowed" : "a call upward"
		bad++
	}
	END { exit bad ? 1 : 0 }
' "$tmp/ranks" "$tmp/allow" "$tmp/edges" || status=1

n=$(wc -l <"$tmp/edges")
if [ $status -eq 0 ]; then
	echo "$prog: $dir is layered: $n cross-file uses in $(wc -l <"$tmp/files") files, all downward"
else
	echo "$prog: FAILED: $dir/ breaks its layer table (see $table; test/check-layering.sh)"
fi
exit $status
