#!/usr/bin/env bash
# Build the guest initramfs for the Soft-RoCE harness:
#   static busybox, test/rxe/init as /init, and the kernel modules the guest
#   needs (closure over modules.dep, dependencies first, listed in
#   /etc/modules.load). Everything else (ip, rdma, libibverbs, perftest, the
#   tests) comes from the host's root filesystem, shared read-only over 9p.
#
#   test/rxe/mkinitramfs.sh KROOT KVER OUTPUT.cpio
#
# Called by run.sh, which caches the result keyed on a content hash.
set -euo pipefail

[ $# -eq 3 ] || { echo "usage: $0 KROOT KVER OUTPUT" >&2; exit 2; }
KROOT=$1 KVER=$2 OUT=$3
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODDIR=$KROOT/lib/modules/$KVER

# Wanted modules, in load order; their dependencies are added in front.
# A name prefixed with '?' may be absent (crc32_generic is gone in 7.x).
# crc32_generic must come before rdma_rxe: rxe allocates the "crc32" shash
# and nothing in the guest would load it on demand early enough.
# virtio_net is for the two-guest harness (test/rxe2/): one virtio NIC each.
MODULES=(
    virtio_pci 9pnet_virtio 9p
    ?crc32_generic rdma_rxe ib_uverbs ib_umad ?rdma_ucm
    veth virtio_net
)
# Loaded by init only for the bridge topology (RXE_TOPO=bridge, guest.sh):
# their closure minus what MODULES already brings, in /etc/modules.bridge.
MODULES_BRIDGE=(bridge)

die() { echo "mkinitramfs: $*" >&2; exit 1; }
[ -f "$MODDIR/modules.dep" ] || die "$MODDIR/modules.dep missing (run setup.sh)"

declare -A DEP_PATH=() DEP_LIST=() SEEN=()
while IFS= read -r line; do
    path=${line%%:*}
    deps=${line#*:}
    name=${path##*/}
    name=${name%%.ko*}
    name=${name//-/_}
    DEP_PATH[$name]=$path
    DEP_LIST[$name]=$deps
done <"$MODDIR/modules.dep"

builtin=" $(sed 's#.*/##;s#\.ko.*##;s#-#_#g' "$MODDIR/modules.builtin" 2>/dev/null | tr '\n' ' ') "

ORDER=()
visit() {
    local m=$1 d dn
    [ -n "${SEEN[$m]:-}" ] && return 0
    SEEN[$m]=1
    for d in ${DEP_LIST[$m]}; do
        dn=${d##*/}
        dn=${dn%%.ko*}
        visit "${dn//-/_}"
    done
    ORDER+=("$m")
}

for want in "${MODULES[@]}"; do
    optional=0
    if [ "${want#\?}" != "$want" ]; then optional=1; want=${want#\?}; fi
    if [ -n "${DEP_PATH[$want]:-}" ]; then
        visit "$want"
    elif [[ $builtin == *" $want "* ]]; then
        : # built into the kernel
    elif [ $optional = 0 ]; then
        die "module $want not found in $MODDIR and not built in"
    fi
done

NBASE=${#ORDER[@]}
for want in "${MODULES_BRIDGE[@]}"; do
    [ -n "${DEP_PATH[$want]:-}" ] || [[ $builtin == *" $want "* ]] ||
        die "module $want not found in $MODDIR and not built in"
    [ -n "${DEP_PATH[$want]:-}" ] && visit "$want"
done

STAGE=$(mktemp -d "${OUT}.stage.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE"/{bin,dev,etc,proc,sys,tmp,run,host,job,newroot} "$STAGE/lib/modules/$KVER"
ln -s bin "$STAGE/sbin"
cp /bin/busybox "$STAGE/bin/busybox"
for applet in $("$STAGE/bin/busybox" --list); do
    [ -e "$STAGE/bin/$applet" ] || ln -s busybox "$STAGE/bin/$applet"
done
install -m 0755 "$HERE/init" "$STAGE/init"
echo "$KVER" >"$STAGE/etc/rxe-kver"

: >"$STAGE/etc/modules.load"
: >"$STAGE/etc/modules.bridge"
n=0
for m in "${ORDER[@]}"; do
    list=modules.load
    [ $((n++)) -ge "$NBASE" ] && list=modules.bridge
    src=$MODDIR/${DEP_PATH[$m]}
    rel=${DEP_PATH[$m]%%.ko*}.ko
    dst=$STAGE/lib/modules/$KVER/$rel
    mkdir -p "$(dirname "$dst")"
    case $src in
    *.ko) cp "$src" "$dst" ;;
    *.ko.xz) xz -dc "$src" >"$dst" ;;
    *.ko.zst) zstd -qdc "$src" >"$dst" ;;
    *.ko.gz) gzip -dc "$src" >"$dst" ;;
    *) die "unknown module format: $src" ;;
    esac
    echo "$rel" >>"$STAGE/etc/$list"
done
for f in modules.builtin modules.builtin.modinfo modules.order; do
    [ -e "$MODDIR/$f" ] && cp "$MODDIR/$f" "$STAGE/lib/modules/$KVER/"
done
# modules.dep for the subset, so busybox modprobe can serve request_module().
depmod -b "$STAGE" "$KVER"

# Uncompressed: the kernel unpacks it faster than it inflates a gzip under TCG.
(cd "$STAGE" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "mkinitramfs: $OUT ($(du -h "$OUT" | cut -f1), modules: ${ORDER[*]:0:NBASE}; bridge topology: ${ORDER[*]:NBASE})" >&2
