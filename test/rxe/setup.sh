#!/usr/bin/env bash
# Prepare the host for the Soft-RoCE QEMU harness. Idempotent.
#
#   test/rxe/setup.sh [--packages-only] [--print-kernel]
#
# 1. apt-get installs the host packages the harness needs, only those missing.
# 2. Picks the kernel package apt offers for `linux-image-amd64` (on Debian 12:
#    linux-image-6.1.0-N-amd64 from bookworm-security) or, on Ubuntu, for
#    `linux-image-generic` (linux-image-X-generic, whose modules are in
#    linux-modules-X-generic and linux-modules-extra-X-generic: rdma_rxe and
#    ib_uverbs are in the extra one), `apt-get download`s it and those of its
#    linux-modules[-extra]-X packages that apt knows (never installs them),
#    unpacks them with `dpkg-deb -x` into one tree in the cache, then runs
#    depmod on it.
# 3. Extracts the uncompressed vmlinux from the bzImage when it has a PVH entry
#    point (Xen ELF note 0x12; Debian's and Ubuntu's kernels do): QEMU then
#    boots it directly, skipping SeaBIOS and the in-guest decompression (~3 s
#    under TCG).
# 4. Writes $RXE_CACHE/kernel.env (RXE_KPKG, RXE_KVER, RXE_KROOT, RXE_VMLINUZ,
#    RXE_VMLINUX; the last is empty when the kernel has no PVH entry).
#
# Environment:
#   RXE_CACHE       cache directory (default: <repo>/build/rxe-cache)
#   RXE_KERNEL_PKG  kernel package to use instead of the one linux-image-amd64
#                   (linux-image-generic) points to (e.g.
#                   linux-image-6.12.57+deb12-amd64, linux-image-6.8.0-31-generic)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${RXE_CACHE:-$REPO/build/rxe-cache}

PACKAGES=(
    qemu-system-x86 rdma-core ibverbs-providers ibverbs-utils libibverbs-dev
    librdmacm-dev rdmacm-utils perftest busybox-static iproute2 cpio kmod
    xz-utils zstd util-linux coreutils gzip binutils
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
    # lists refreshed in the last 30 minutes (e.g. by .ci/run) are fresh enough
    if [ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -cmin -30 2>/dev/null | head -n1)" ]; then
        APT_UPDATED=1
        return 0
    fi
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
    # dpkg-query exits 1 when any of them is not installed (or unknown): that
    # is the normal case on a fresh machine, not an error.
    installed=" $({ dpkg-query -W -f='${db:Status-Status} ${Package}\n' "${PACKAGES[@]}" 2>/dev/null ||
        true; } | sed -n 's/^installed //p' | tr '\n' ' ') "
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

# The kernel package name: the one linux-image-amd64's candidate depends on
# (Debian), else linux-image-generic's (Ubuntu).
resolve_kernel_pkg() {
    if [ -n "${RXE_KERNEL_PKG:-}" ]; then
        echo "$RXE_KERNEL_PKG"
        return 0
    fi
    {
        apt-cache depends linux-image-amd64 2>/dev/null |
            sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p'
        apt-cache depends linux-image-generic 2>/dev/null |
            sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-generic\)$/\1/p'
    } | head -n1
}

# kernel_debs PKG: PKG and the packages that hold its modules where they are
# apart from the image (Ubuntu: linux-modules-X and linux-modules-extra-X for
# linux-image-X), those that apt knows.
kernel_debs() {
    local pkg=$1 flavour=${1#linux-image-} extra
    echo "$pkg"
    [ "$flavour" != "$pkg" ] || return 0
    for extra in "linux-modules-$flavour" "linux-modules-extra-$flavour"; do
        apt-cache show "$extra" >/dev/null 2>&1 && echo "$extra"
    done
    return 0
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
    local debs=()
    mapfile -t debs < <(kernel_debs "$pkg")
    log "downloading ${debs[*]} (apt-get download, not installed)"
    # apt-get download runs as root here; -o APT::Sandbox::User=root avoids
    # the "_apt cannot access" warning for a directory owned by root.
    if ! (cd "$tmp/dl" && apt-get download -q -o APT::Sandbox::User=root "${debs[@]}" >&2); then
        apt_update
        mapfile -t debs < <(kernel_debs "$pkg")
        (cd "$tmp/dl" && apt-get download -q -o APT::Sandbox::User=root "${debs[@]}" >&2) ||
            { rm -rf "$tmp"; die "apt-get download ${debs[*]} failed"; }
    fi
    local deb
    for deb in "$tmp"/dl/*.deb; do
        log "unpacking $(basename "$deb")"
        dpkg-deb -x "$deb" "$tmp/root"
    done
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
        die "$pkg has no rdma_rxe module (cloud kernels lack it; use a generic -amd64 image; on Ubuntu it is in linux-modules-extra-${pkg#linux-image-})"
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

# has_pvh_note ELF: the kernel can be booted by QEMU -kernel as a PVH ELF.
has_pvh_note() {
    readelf -n "$1" 2>/dev/null | grep -Eq 'note type: \(0x00000012\)|PHYS32_ENTRY'
}

# extract_vmlinux BZIMAGE OUT: find the compressed payload inside the bzImage
# by its magic, inflate it, keep the first result that is an ELF with PVH.
extract_vmlinux() {
    local img=$1 out=$2 magic cmd off
    for pair in '\xfd7zXZ\x00:xz -dc --single-stream' '\x28\xb5\x2f\xfd:zstd -qdc' \
        '\x1f\x8b\x08:gzip -dc' '\x02\x21\x4c\x18:lz4 -dc'; do
        magic=${pair%%:*}
        cmd=${pair#*:}
        for off in $(LC_ALL=C grep -obUaP "$magic" "$img" 2>/dev/null | head -n 4 | cut -d: -f1); do
            tail -c +$((off + 1)) "$img" | $cmd >"$out.tmp" 2>/dev/null
            if [ "$(head -c 4 "$out.tmp" | tr -d '\0')" = $'\x7fELF' ] && has_pvh_note "$out.tmp"; then
                mv "$out.tmp" "$out"
                return 0
            fi
        done
    done
    rm -f "$out.tmp"
    return 1
}

ensure_vmlinux() {
    local kdir=$1 vmlinuz=$2
    [ -e "$kdir/vmlinux" ] || [ -e "$kdir/.no-pvh" ] && return 0
    if extract_vmlinux "$vmlinuz" "$kdir/vmlinux"; then
        log "extracted $kdir/vmlinux (PVH boot)"
    else
        log "no PVH vmlinux in $vmlinuz; QEMU boots the bzImage (slower)"
        touch "$kdir/.no-pvh"
    fi
}

install_packages
[ "$packages_only" = 1 ] && exit 0

mkdir -p "$CACHE/kernel"
exec 8>"$CACHE/.setup.lock"
flock 8

pkg=
# Fast path: the kernel chosen last time, unless the apt lists changed since.
if [ -z "${RXE_KERNEL_PKG:-}" ] && [ -s "$CACHE/kernel.env" ] &&
    [ -z "$(find /var/lib/apt/lists -maxdepth 1 -cnewer "$CACHE/kernel.env" -name '*Packages*' 2>/dev/null)" ]; then
    pkg=$(sed -n 's/^RXE_KPKG=//p' "$CACHE/kernel.env")
    [ -e "$CACHE/kernel/$pkg/.complete" ] || pkg=
fi
[ -n "$pkg" ] || pkg=$(resolve_kernel_pkg || true)
if [ -z "$pkg" ] && [ "$(id -u)" = 0 ] && ! cached_kernel_pkg >/dev/null; then
    apt_update
    pkg=$(resolve_kernel_pkg || true)
fi
if [ -z "$pkg" ]; then
    pkg=$(cached_kernel_pkg) || die "no kernel package found (apt-cache depends linux-image-amd64 and linux-image-generic are empty)"
    log "apt offers no kernel; using cached $pkg"
fi
fetch_kernel "$pkg"

kdir=$CACHE/kernel/$pkg
# shellcheck disable=SC1091
. "$kdir/kernel.env"
ensure_vmlinux "$kdir" "$kdir/root/$RXE_VMLINUZ_REL"
vmlinux=
[ -e "$kdir/vmlinux" ] && vmlinux=$kdir/vmlinux
{
    echo "RXE_KPKG=$RXE_KPKG"
    echo "RXE_KVER=$RXE_KVER"
    echo "RXE_KROOT=$kdir/root"
    echo "RXE_VMLINUZ=$kdir/root/$RXE_VMLINUZ_REL"
    echo "RXE_VMLINUX=$vmlinux"
} >"$CACHE/kernel.env.tmp"
mv "$CACHE/kernel.env.tmp" "$CACHE/kernel.env"
[ "$print_kernel" = 1 ] && cat "$CACHE/kernel.env"
exit 0
