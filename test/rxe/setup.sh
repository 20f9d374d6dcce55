#!/usr/bin/env bash
# Prepare the host for the Soft-RoCE QEMU harness. Idempotent.
#
#   test/rxe/setup.sh [--packages-only] [--print-kernel]
#
# 1. apt-get installs the host packages the harness needs, only those missing.
# 2. Picks the kernel package apt offers for `linux-image-amd64` (on Debian 12:
#    linux-image-6.1.0-N-amd64 from bookworm-security), `apt-get download`s it
#    (never installs it) and unpacks it with `dpkg-deb -x` into the cache, then
#    runs depmod on the unpacked tree.
# 3. Writes $RXE_CACHE/kernel.env (RXE_KVER, RXE_KROOT, RXE_VMLINUZ, RXE_KPKG).
#
# Environment:
#   RXE_CACHE       cache directory (default: <repo>/build/rxe-cache)
#   RXE_KERNEL_PKG  kernel package to use instead of the one linux-image-amd64
#                   points to (e.g. linux-image-6.12.57+deb12-amd64)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${RXE_CACHE:-$REPO/build/rxe-cache}

PACKAGES=(
    qemu-system-x86 rdma-core ibverbs-providers ibverbs-utils libibverbs-dev
    librdmacm-dev rdmacm-utils perftest busybox-static iproute2 cpio kmod
    xz-utils zstd util-linux coreutils gzip
)

log() { printf 'rxe-setup: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

packages_only=0
print_kernel=0
for arg in "$@"; do
    case $arg in
    --packages-only) packages_only=1 ;;
    --print-kernel) print_kernel=1 ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//;/^set -e/d'; exit 0 ;;
    *) die "unknown argument: $arg" ;;
    esac
done

APT_UPDATED=0
apt_update() {
    [ "$APT_UPDATED" = 1 ] && return 0
    log "apt-get update"
    apt-get update -qq >&2
    APT_UPDATED=1
}

need_root() {
    [ "$(id -u)" = 0 ] || die "$1 needs root (run as root, or install: ${*:2})"
}

install_packages() {
    local missing=() p
    local installed
    installed=" $(dpkg-query -W -f='${db:Status-Status} ${Package}\n' "${PACKAGES[@]}" 2>/dev/null |
        sed -n 's/^installed //p' | tr '\n' ' ') "
    for p in "${PACKAGES[@]}"; do
        case $installed in *" $p "*) ;; *) missing+=("$p") ;; esac
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    need_root "installing packages" "${missing[@]}"
    apt_update
    log "installing: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >&2
}

# The kernel package name: the one linux-image-amd64's candidate depends on.
resolve_kernel_pkg() {
    if [ -n "${RXE_KERNEL_PKG:-}" ]; then
        echo "$RXE_KERNEL_PKG"
        return 0
    fi
    apt-cache depends linux-image-amd64 2>/dev/null |
        sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -n1
}

# Newest kernel already unpacked in the cache (offline fallback).
cached_kernel_pkg() {
    local d
    for d in $(ls -1d "$CACHE"/kernel/*/.complete 2>/dev/null | sort -V -r); do
        basename "$(dirname "$d")"
        return 0
    done
    return 1
}

fetch_kernel() {
    local pkg=$1 dir=$CACHE/kernel/$1
    [ -e "$dir/.complete" ] && return 0
    need_root "downloading the kernel" "$pkg"
    local tmp=$CACHE/kernel/.tmp-$pkg.$$
    rm -rf "$tmp"
    mkdir -p "$tmp/dl"
    log "downloading $pkg (apt-get download, not installed)"
    # apt-get download runs as root here; -o APT::Sandbox::User=root avoids
    # the "_apt cannot access" warning for a directory owned by root.
    if ! (cd "$tmp/dl" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2); then
        apt_update
        (cd "$tmp/dl" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2) ||
            { rm -rf "$tmp"; die "apt-get download $pkg failed"; }
    fi
    local deb
    deb=$(ls "$tmp"/dl/*.deb)
    log "unpacking $(basename "$deb")"
    dpkg-deb -x "$deb" "$tmp/root"
    # Newer kernels (trixie) ship usr/lib/modules only.
    if [ ! -e "$tmp/root/lib/modules" ] && [ -d "$tmp/root/usr/lib/modules" ]; then
        ln -s usr/lib "$tmp/root/lib"
    fi
    local kver
    kver=$(ls -1 "$tmp/root/lib/modules" | head -n1)
    [ -n "$kver" ] || { rm -rf "$tmp"; die "$pkg has no lib/modules"; }
    local vmlinuz=$tmp/root/boot/vmlinuz-$kver
    [ -e "$vmlinuz" ] || vmlinuz=$tmp/root/lib/modules/$kver/vmlinuz
    [ -e "$vmlinuz" ] || { rm -rf "$tmp"; die "$pkg has no vmlinuz"; }
    if ! find "$tmp/root/lib/modules/$kver" -name 'rdma_rxe.ko*' | grep -q .; then
        rm -rf "$tmp"
        die "$pkg has no rdma_rxe module (cloud kernels lack it; use a generic -amd64 image)"
    fi
    log "depmod $kver"
    depmod -b "$tmp/root" "$kver"
    rm -rf "$tmp/dl"
    {
        echo "RXE_KPKG=$pkg"
        echo "RXE_KVER=$kver"
        echo "RXE_VMLINUZ_REL=${vmlinuz#"$tmp"/root/}"
    } >"$tmp/kernel.env"
    rm -rf "$dir"
    mv "$tmp" "$dir"
    touch "$dir/.complete"
    # Keep only the kernel in use plus one older one.
    local old
    for old in $(ls -1d "$CACHE"/kernel/linux-* 2>/dev/null | grep -vxF "$dir" | sort -V | head -n -1); do
        log "removing old kernel $old"
        rm -rf "$old"
    done
}

install_packages
[ "$packages_only" = 1 ] && exit 0

mkdir -p "$CACHE/kernel"
exec 8>"$CACHE/.setup.lock"
flock 8

pkg=$(resolve_kernel_pkg || true)
if [ -z "$pkg" ] && [ "$(id -u)" = 0 ] && ! cached_kernel_pkg >/dev/null; then
    apt_update
    pkg=$(resolve_kernel_pkg || true)
fi
if [ -z "$pkg" ]; then
    pkg=$(cached_kernel_pkg) || die "no kernel package found (apt-cache depends linux-image-amd64 is empty)"
    log "apt offers no kernel; using cached $pkg"
fi
fetch_kernel "$pkg"

kdir=$CACHE/kernel/$pkg
# shellcheck disable=SC1091
. "$kdir/kernel.env"
{
    echo "RXE_KPKG=$RXE_KPKG"
    echo "RXE_KVER=$RXE_KVER"
    echo "RXE_KROOT=$kdir/root"
    echo "RXE_VMLINUZ=$kdir/root/$RXE_VMLINUZ_REL"
} >"$CACHE/kernel.env.tmp"
mv "$CACHE/kernel.env.tmp" "$CACHE/kernel.env"
[ "$print_kernel" = 1 ] && cat "$CACHE/kernel.env"
exit 0
