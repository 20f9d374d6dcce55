#!/usr/bin/env bash
# Build the Debian package from an already built tree (make deb calls this).
#
#   packaging/make-deb.sh BUILD_DIR VERSION
#
# Writes BUILD_DIR/pkg/nccl-net-rail_VERSION_ARCH.deb with dpkg-deb alone (no
# debhelper): the plugin in the multiarch library directory, which is on the
# loader's default path, so NCCL_NET_PLUGIN=rail works right after
# `apt install ./nccl-net-rail_VERSION_ARCH.deb`; the tools in /usr/bin; the
# README, docs, changelog, licence and example configuration in
# /usr/share/doc/nccl-net-rail. A trigger refreshes the loader cache.
# libibverbs is loaded at run time, so it is a recommendation, not a
# dependency: without it the plugin uses its TCP transport and says why.
set -euo pipefail

build=${1:?usage: make-deb.sh BUILD_DIR VERSION}
version=${2:?usage: make-deb.sh BUILD_DIR VERSION}
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"

die() { echo "make-deb: $*" >&2; exit 1; }
command -v dpkg-deb >/dev/null || die "dpkg-deb not found (apt-get install dpkg)"
for f in "$build/libnccl-net-rail.so" "$build/rail-info" "$build/rail-bench" "$build/rail-check" \
	"$build/rail-rawtcp"; do
	[ -f "$f" ] || die "$f is missing: run make first"
done

arch=$(dpkg --print-architecture)
multiarch=$(${CC:-gcc} -print-multiarch 2>/dev/null || true)
[ -n "$multiarch" ] || multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || true)
[ -n "$multiarch" ] || die "cannot tell the multiarch triplet (gcc -print-multiarch)"

stage=$build/pkg/deb-root
rm -rf "$stage"
make --no-print-directory -s install DESTDIR="$stage" PREFIX=/usr LIBDIR="/usr/lib/$multiarch" \
	BINDIR=/usr/bin DOCDIR=/usr/share/doc/nccl-net-rail BUILD="$build" >/dev/null
strip --strip-unneeded "$stage/usr/lib/$multiarch/libnccl-net-rail.so" "$stage"/usr/bin/rail-*

doc=$stage/usr/share/doc/nccl-net-rail
# Debian policy: the licence as doc/copyright, the changelog compressed.
{
	echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
	echo "Upstream-Name: nccl-net-rail"
	echo
	echo "Files: *"
	echo "License: Apache-2.0"
	echo " On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0"
	echo " and, with this package, in /usr/share/doc/nccl-net-rail/LICENSE."
} >"$doc/copyright"
gzip -9n "$doc/CHANGELOG.md"

# The newest glibc symbol version any binary needs: the libc6 dependency.
glibc=$(objdump -T "$stage/usr/lib/$multiarch/libnccl-net-rail.so" "$stage"/usr/bin/rail-* |
	grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1)
[ -n "$glibc" ] || die "no glibc symbol versions found by objdump -T"

mkdir -p "$stage/DEBIAN"
cat >"$stage/DEBIAN/control" <<CTRL
Package: nccl-net-rail
Version: $version
Architecture: $arch
Maintainer: nccl-net-rail developers <nccl-net-rail@invalid>
Installed-Size: $(du -sk --exclude=DEBIAN "$stage" | cut -f1)
Depends: libc6 (>= $glibc)
Recommends: libibverbs1, ibverbs-providers
Section: net
Priority: optional
Description: NCCL network plugin for RDMA verbs and TCP
 libnccl-net-rail.so moves NCCL's inter-node traffic over InfiniBand and RoCE
 (rdma-core, loaded at run time) and falls back to its own multi-stream TCP
 transport. One library serves NCCL 2.13 and later (net plugin ABIs v6-v12).
 Set NCCL_NET_PLUGIN=rail to use it. Tools: rail-info (the doctor, also a
 readiness check), rail-bench (latency and bandwidth between two hosts),
 rail-check (a preflight across nodes: every NIC to every peer NIC), rail-rawtcp.
CTRL
echo "activate-noawait ldconfig" >"$stage/DEBIAN/triggers"
(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z |
	xargs -0 md5sum >DEBIAN/md5sums)

out=$build/pkg/nccl-net-rail_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$stage" "$out" >/dev/null
echo "make-deb: $out"
