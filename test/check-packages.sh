#!/usr/bin/env bash
# nccl-net-rail: check the install targets and the packages (make test-packages).
#
#   test/check-packages.sh PKG_DIR
#
# 1. make install into a DESTDIR puts the plugin, the three tools and the docs
#    where LIBDIR/BINDIR/DOCDIR say, NCCL_DEFAULT_LINK=1 adds libnccl-net.so,
#    and make uninstall takes every file back out.
# 2. The .deb in PKG_DIR (make deb) has the version of the file VERSION, the
#    plugin in the multiarch library directory, the tools, the docs and the
#    ldconfig trigger, and the tools it carries print that version.
# 3. make rpm builds a binary RPM with the same files (skipped, saying why,
#    without rpmbuild).
# Exit status: 0 pass, 1 a check failed.
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
pkgdir=${1:?usage: check-packages.sh PKG_DIR}
version=$(cat VERSION)
fails=0
ok() { echo "ok: $*"; }
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
expect_file() { if [ -e "$1" ]; then ok "$2"; else fail "$2 ($1 missing)"; fi; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---- 1. install / uninstall ------------------------------------------------
d=$tmp/inst
make --no-print-directory -s install DESTDIR="$d" PREFIX=/opt/rail NCCL_DEFAULT_LINK=1 >/dev/null
expect_file "$d/opt/rail/lib/libnccl-net-rail.so" "install: plugin in PREFIX/lib"
for t in rail-info rail-bench rail-check rail-rawtcp; do
	expect_file "$d/opt/rail/bin/$t" "install: $t in PREFIX/bin"
done
expect_file "$d/opt/rail/share/doc/nccl-net-rail/nccl-net.conf.example" "install: example config in DOCDIR"
expect_file "$d/opt/rail/share/doc/nccl-net-rail/LICENSE" "install: LICENSE in DOCDIR"
if [ "$(readlink "$d/opt/rail/lib/libnccl-net.so" 2>/dev/null)" = libnccl-net-rail.so ]; then
	ok "install: NCCL_DEFAULT_LINK=1 links libnccl-net.so"
else
	fail "install: NCCL_DEFAULT_LINK=1 did not link libnccl-net.so -> libnccl-net-rail.so"
fi
make --no-print-directory -s install DESTDIR="$d" PREFIX=/opt/rail LIBDIR=/opt/rail/lib64 >/dev/null
expect_file "$d/opt/rail/lib64/libnccl-net-rail.so" "install: LIBDIR honoured"
make --no-print-directory -s uninstall DESTDIR="$d" PREFIX=/opt/rail >/dev/null
make --no-print-directory -s uninstall DESTDIR="$d" PREFIX=/opt/rail LIBDIR=/opt/rail/lib64 >/dev/null
left=$(find "$d" -type f -o -type l)
if [ -z "$left" ]; then ok "uninstall: no file left"; else fail "uninstall left: $left"; fi

# ---- 2. the .deb -------------------------------------------------------------
deb=$(ls "$pkgdir"/nccl-net-rail_"$version"_*.deb 2>/dev/null | head -n1 || true)
if [ -z "$deb" ]; then
	fail "no $pkgdir/nccl-net-rail_${version}_*.deb (make deb)"
else
	multiarch=$(${CC:-gcc} -print-multiarch)
	[ "$(dpkg-deb -f "$deb" Version)" = "$version" ] && ok "deb: Version $version" ||
		fail "deb: Version $(dpkg-deb -f "$deb" Version), VERSION says $version"
	list=$(dpkg-deb -c "$deb" | awk '{print $6}')
	for f in "./usr/lib/$multiarch/libnccl-net-rail.so" ./usr/bin/rail-info ./usr/bin/rail-bench \
		./usr/bin/rail-check ./usr/bin/rail-rawtcp ./usr/share/doc/nccl-net-rail/copyright \
		./usr/share/doc/nccl-net-rail/nccl-net.conf.example ./usr/share/doc/nccl-net-rail/DEPLOY.md; do
		if grep -qxF "$f" <<<"$list"; then ok "deb: has $f"; else fail "deb: lacks $f"; fi
	done
	if grep -q 'libnccl-net.so$' <<<"$list"; then
		fail "deb: ships libnccl-net.so (would take NCCL's default name from other plugins)"
	else
		ok "deb: no libnccl-net.so"
	fi
	[ "$(dpkg-deb --ctrl-tarfile "$deb" | tar -xOf - ./triggers 2>/dev/null)" = "activate-noawait ldconfig" ] &&
		ok "deb: ldconfig trigger" || fail "deb: no ldconfig trigger"
	x=$tmp/deb
	dpkg-deb -x "$deb" "$x"
	for t in rail-info rail-bench rail-check rail-rawtcp; do
		out=$("$x/usr/bin/$t" --version 2>&1 || true)
		if [ "$out" = "$t (nccl-net-rail) $version" ]; then
			ok "deb: $t --version says $version"
		else
			fail "deb: $t --version printed: $out"
		fi
	done
	if strings "$x/usr/lib/$multiarch/libnccl-net-rail.so" | grep -c "^@(#)nccl-net-rail $version\$" >/dev/null; then
		ok "deb: the plugin carries version $version"
	else
		fail "deb: no '@(#)nccl-net-rail $version' ident in the plugin"
	fi
fi

# ---- 3. the RPM --------------------------------------------------------------
if ! command -v rpmbuild >/dev/null; then
	echo "SKIP: rpm: rpmbuild not installed (apt-get install rpm)"
else
	if make --no-print-directory -s rpm >"$tmp/rpm.log" 2>&1; then
		rpmfile=$(ls "$pkgdir"/rpm/RPMS/*/nccl-net-rail-"$version"-1*.rpm 2>/dev/null | head -n1 || true)
		if [ -n "$rpmfile" ]; then
			rlist=$(rpm -qlp "$rpmfile" 2>/dev/null)
			for f in /usr/bin/rail-info /usr/bin/rail-bench /usr/bin/rail-check /usr/bin/rail-rawtcp; do
				grep -qxF "$f" <<<"$rlist" && ok "rpm: has $f" || fail "rpm: lacks $f"
			done
			grep -q '/libnccl-net-rail.so$' <<<"$rlist" && ok "rpm: has the plugin" ||
				fail "rpm: lacks libnccl-net-rail.so"
		else
			fail "rpm: make rpm made no nccl-net-rail-$version-1 RPM"
		fi
	else
		cat "$tmp/rpm.log" >&2
		fail "rpm: make rpm failed"
	fi
fi

if [ "$fails" -ne 0 ]; then
	echo "check-packages: $fails failed" >&2
	exit 1
fi
echo "check-packages: all passed"
