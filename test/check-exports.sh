#!/bin/sh
# nccl-net-rail: check the plugin's dynamic symbol table.
#
#   test/check-exports.sh PLUGIN.so
#
# Passes only when the defined dynamic symbols are exactly the net plugin
# tables ncclNetPlugin_v6 .. ncclNetPlugin_v12, the RMA tables
# ncclRmaPlugin_v13 and ncclRmaPlugin_v14 and the tuner tables
# ncclTunerPlugin_v3 .. ncclTunerPlugin_v6, each a data object (NCCL
# finds them with dlsym and reads them as structs). Anything else leaking
# out of the .so (a core function, a libc wrapper, a C++ symbol) fails,
# listed by name. Exit status: 0 pass, 1 mismatch, 2 usage or tool error.
set -eu

prog=check-exports
expected="ncclNetPlugin_v6 ncclNetPlugin_v7 ncclNetPlugin_v8 ncclNetPlugin_v9
ncclNetPlugin_v10 ncclNetPlugin_v11 ncclNetPlugin_v12 ncclRmaPlugin_v13 ncclRmaPlugin_v14
ncclTunerPlugin_v3 ncclTunerPlugin_v4 ncclTunerPlugin_v5 ncclTunerPlugin_v6"
# Symbols some linkers add to every shared object; none are expected with
# plugin/exports.map ("local: *"), but they are not ours if they appear.
linker_syms="_init _fini _edata _end __bss_start"

if [ $# -ne 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
	echo "usage: $0 PLUGIN.so" >&2
	exit 2
fi
so=$1
if [ ! -f "$so" ]; then
	echo "$prog: $so: no such file (build it with 'make plugin')" >&2
	exit 2
fi
if ! command -v nm >/dev/null 2>&1; then
	echo "$prog: nm not found (install binutils)" >&2
	exit 2
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/check-exports.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

if ! nm -D --defined-only "$so" >"$tmp/nm" 2>"$tmp/nm.err"; then
	echo "$prog: nm -D --defined-only $so failed:" >&2
	cat "$tmp/nm.err" >&2
	exit 2
fi

# "ADDRESS TYPE NAME[@VERSION]": keep TYPE and NAME, drop version suffixes.
awk 'NF >= 3 { name = $3; sub(/@.*/, "", name); print $2, name }' "$tmp/nm" >"$tmp/defined"

: >"$tmp/extra"
: >"$tmp/badtype"
while read -r type name; do
	is_expected=0
	for e in $expected; do
		[ "$name" = "$e" ] && is_expected=1
	done
	if [ $is_expected -eq 1 ]; then
		case $type in
		D | R | B | V) ;;
		*) echo "$name (nm type $type, expected a data object: D, R, B or V)" >>"$tmp/badtype" ;;
		esac
		continue
	fi
	is_linker=0
	for l in $linker_syms; do
		[ "$name" = "$l" ] && is_linker=1
	done
	# Version-node names appear as absolute symbols when a map names them.
	[ "$type" = A ] && is_linker=1
	[ $is_linker -eq 1 ] || echo "$name (nm type $type)" >>"$tmp/extra"
done <"$tmp/defined"

: >"$tmp/missing"
for e in $expected; do
	awk -v n="$e" '$2 == n { found = 1 } END { exit !found }' "$tmp/defined" ||
		echo "$e" >>"$tmp/missing"
done

status=0
if [ -s "$tmp/missing" ]; then
	echo "$prog: $so does not export:" >&2
	sed 's/^/  /' "$tmp/missing" >&2
	status=1
fi
if [ -s "$tmp/extra" ]; then
	echo "$prog: $so exports symbols other than ncclNetPlugin_v6..v12, ncclRmaPlugin_v13, ncclRmaPlugin_v14 and ncclTunerPlugin_v3..v6" \
		"(give them static or hidden visibility; plugin/exports.map lists the exports):" >&2
	sed 's/^/  /' "$tmp/extra" >&2
	status=1
fi
if [ -s "$tmp/badtype" ]; then
	echo "$prog: $so: plugin tables that are not data objects:" >&2
	sed 's/^/  /' "$tmp/badtype" >&2
	status=1
fi
if [ $status -eq 0 ]; then
	echo "$prog: $so exports exactly ncclNetPlugin_v6 .. ncclNetPlugin_v12, ncclRmaPlugin_v13, ncclRmaPlugin_v14 and ncclTunerPlugin_v3 .. ncclTunerPlugin_v6"
fi
exit $status
