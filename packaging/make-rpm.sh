#!/usr/bin/env bash
# Build the RPM (make rpm calls this).
#
#   packaging/make-rpm.sh BUILD_DIR VERSION
#
# Packs the tracked files (and new, not ignored ones) into
# BUILD_DIR/pkg/rpm/SOURCES/nccl-net-rail-VERSION.tar.gz and runs rpmbuild -ba
# on packaging/nccl-net-rail.spec there. On a host that is not RPM-based
# (Debian with the rpm package, as in CI) the BuildRequires cannot be checked
# against an RPM database, so they are skipped (--nodeps) and said so.
set -euo pipefail

build=${1:?usage: make-rpm.sh BUILD_DIR VERSION}
version=${2:?usage: make-rpm.sh BUILD_DIR VERSION}
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
command -v rpmbuild >/dev/null || { echo "make-rpm: rpmbuild not found (dnf install rpm-build; Debian: apt-get install rpm)" >&2; exit 1; }

topdir=$(cd "$build" && pwd)/pkg/rpm
rm -rf "$topdir"
mkdir -p "$topdir"/{SOURCES,SPECS,BUILD,RPMS,SRPMS}
name=nccl-net-rail-$version
stage=$topdir/$name
mkdir -p "$stage"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
	[ -e "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -xf - -C "$stage"
tar -C "$topdir" -czf "$topdir/SOURCES/$name.tar.gz" "$name"
rm -rf "$stage"

nodeps=()
if ! rpm -q rpm >/dev/null 2>&1; then
	echo "make-rpm: not an RPM-based host: BuildRequires (gcc, make, rdma-core-devel) not checked" >&2
	nodeps=(--nodeps)
fi
rpmbuild -ba "${nodeps[@]}" --define "_topdir $topdir" --define "rail_version $version" \
	packaging/nccl-net-rail.spec >"$topdir/rpmbuild.log" 2>&1 ||
	{ tail -n 30 "$topdir/rpmbuild.log" >&2; echo "make-rpm: rpmbuild failed; log: $topdir/rpmbuild.log" >&2; exit 1; }
find "$topdir/RPMS" "$topdir/SRPMS" -name '*.rpm' -printf 'make-rpm: %p\n'
