#!/bin/sh
# nccl-ib-params.sh: the NCCL_IB_* parameters an NCCL source tree declares,
# one "NAME<TAB>DEFAULT" a line, sorted.
#
#   nccl-ib-params.sh DIR              a source checkout (reads DIR/src)
#   nccl-ib-params.sh -g GITDIR REV    a revision of a git (or bare mirror)
#                                      repository, without a checkout
#   -p PREFIX (before the other args)  another prefix than NCCL_IB_
#                                      (e.g. NCCL_ for every parameter)
#
# What it finds (comments stripped first; declarations may span lines):
#   NCCL_PARAM(Name, "IB_X", default)          -> NCCL_IB_X   default
#   DEFINE_NCCL_PARAM(name, type, NCCL_IB_X, default, ...)   (NCCL 2.30+)
#   ncclGetEnv("NCCL_IB_X") / getenv("NCCL_IB_X")
#                                              -> NCCL_IB_X   (string)
# A name declared twice with different defaults prints one line per default.
# Needs sh, perl and (for -g) git and tar.
set -eu

prefix=NCCL_IB_
usage() {
	echo "usage: $0 [-p PREFIX] DIR | [-p PREFIX] -g GITDIR REV" >&2
	exit 2
}
if [ "${1:-}" = "-p" ]; then
	[ $# -ge 2 ] || usage
	prefix=$2
	shift 2
fi

# The sources, concatenated on stdout (one file after another: the parser
# does not need file boundaries, and a declaration never spans two files).
sources() {
	if [ "$1" = "-g" ]; then
		git --git-dir="$2" archive --format=tar "$3" src |
			tar -xOf - --wildcards '*.c' '*.cc' '*.cpp' '*.cu' '*.h' '*.hpp' '*.cuh' \
				2>/dev/null || true
	else
		find "$1/src" -type f \( -name '*.c' -o -name '*.cc' -o -name '*.cpp' -o \
			-name '*.cu' -o -name '*.h' -o -name '*.hpp' -o -name '*.cuh' \) \
			-exec cat {} +
	fi
}

case "${1:-}" in
-g)
	[ $# -eq 3 ] || usage
	git --git-dir="$2" rev-parse -q --verify "$3^{commit}" >/dev/null ||
		{ echo "$0: no revision $3 in $2" >&2; exit 1; }
	;;
"" | -*)
	usage
	;;
*)
	[ $# -eq 1 ] || usage
	[ -d "$1/src" ] || { echo "$0: $1/src is not a directory" >&2; exit 1; }
	;;
esac

sources "$@" | PREFIX="$prefix" perl -0777 -ne '
	my $p = $ENV{PREFIX};
	(my $short = $p) =~ s/^NCCL_//;		# NCCL_PARAM adds the NCCL_ itself
	s{/\*.*?\*/}{ }gs;			# block comments
	s{(^|[ \t;{}])//[^\n]*}{$1}gm;		# line comments (not the // of a URL)
	my %seen;
	my $args = qr/((?:[^()"]++|"(?:[^"\\]|\\.)*"|\((?1)\))*)/;	# balanced
	while (/\bNCCL_PARAM\s*\(\s*\w+\s*,\s*"(\Q$short\E[A-Za-z0-9_]*)"\s*,\s*$args\)/g) {
		my ($n, $d) = ("NCCL_$1", $2);
		$d =~ s/\s+/ /g; $d =~ s/^ | $//g;
		$seen{"$n\t$d"} = 1;
	}
	while (/\bDEFINE_NCCL_PARAM\s*\(\s*\w+\s*,\s*[^,]+?,\s*(\Q$p\E[A-Za-z0-9_]*)\s*,\s*((?:[^(),]++|\((?2)\))*)/g) {
		my ($n, $d) = ($1, $2);
		$d =~ s/\s+/ /g; $d =~ s/^ | $//g;
		$seen{"$n\t$d"} = 1;
	}
	while (/\b(?:ncclGetEnv|getenv)\s*\(\s*"(\Q$p\E[A-Za-z0-9_]*)"\s*\)/g) {
		$seen{"$1\t(string)"} = 1;
	}
	print "$_\n" for sort keys %seen;
'
