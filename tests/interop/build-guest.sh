#!/usr/bin/env bash
# build-guest.sh — build the QEMU guest that carries the Linux kernel's Soft-RoCE driver
# (rdma_rxe) and the stock RDMA tools, entirely from Debian bookworm packages.
#
# Outputs, in $SOFTROCE_INTEROP_CACHE (default /var/cache/softroce-interop; never in the repo):
#   guest/vmlinuz       Debian's stock kernel (what linux-image-amd64 points to)
#   guest/initrd.img    tiny busybox initramfs: loads virtio + ext4, mounts /dev/vda, switch_root
#   guest/rootfs.img    ext4 image: debootstrap --variant=minbase + RDMA tools + our init
#   guest/manifest.txt  versions of the kernel and of every RDMA package inside the guest
#   guest/packages.txt  every Debian package (and version) in the guest
#   guest/stamp         hash of the inputs; when it matches, nothing is rebuilt
#
# Idempotent: the kernel download and the debootstrap are cached; the image is rebuilt only when
# this script, guest/initrd-init, guest/init or the package list change (or with --force).
# Host tools it needs (installed by `rig.sh install`): debootstrap busybox-static cpio kmod
# e2fsprogs zstd.  Needs root (debootstrap, chroot).  Adapted from the shared rig's recipe.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${SOFTROCE_INTEROP_CACHE:-/var/cache/softroce-interop}
SUITE=bookworm
MIRROR=${SOFTROCE_INTEROP_MIRROR:-http://deb.debian.org/debian}
FORCE=0
[[ ${1:-} == --force ]] && FORCE=1

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export DEBIAN_FRONTEND=noninteractive LC_ALL=C

# Packages installed into the guest rootfs on top of debootstrap minbase.
GUEST_PKGS=(
  rdma-core ibverbs-providers ibverbs-utils perftest rdmacm-utils infiniband-diags
  iproute2 tcpdump kmod procps netbase python3-pyverbs ucx-utils openmpi-bin
)
# Kernel modules copied (with their dependencies) into the rootfs.
GUEST_MODS=(
  rdma_rxe rdma_ucm ib_umad ib_uverbs virtio_net 9p 9pnet_virtio sch_netem veth ifb
  crc32c_generic crc32_generic crc32_pclmul
)
# Kernel modules the initramfs loads, in this order, to reach the ext4 root on virtio-blk.
INITRD_MODS=(virtio_pci virtio_blk crc32c_generic ext4)

log() { printf '[build-guest %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
T0=$(date +%s)
mkdir -p "$CACHE"/{debs,guest}

for t in debootstrap cpio depmod mke2fs zstd busybox; do
  command -v "$t" >/dev/null || { echo "build-guest: '$t' is missing; run 'rig.sh install' first" >&2; exit 2; }
done
# the initramfs needs the static busybox (package busybox-static), not the dynamic one
if ldd "$(command -v busybox)" >/dev/null 2>&1; then
  echo "build-guest: $(command -v busybox) is dynamically linked; install busybox-static" >&2; exit 2
fi

# ---------------------------------------------------------------- 1. kernel
KDEB_PKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
if [[ -z $KDEB_PKG ]]; then
  apt-get update -qq
  KDEB_PKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
fi
[[ -n $KDEB_PKG ]] || { echo "build-guest: cannot resolve linux-image-amd64" >&2; exit 1; }
KVER=${KDEB_PKG#linux-image-}
KDIR=$CACHE/kernel-$KVER
if [[ $FORCE == 1 || ! -f $KDIR/.done ]]; then
  log "downloading $KDEB_PKG"
  rm -rf "$KDIR"; mkdir -p "$KDIR"
  (cd "$CACHE/debs" && apt-get download -q "$KDEB_PKG" 2>&1 | grep -v unsandboxed || true)
  dpkg-deb -x "$CACHE"/debs/"$KDEB_PKG"_*_amd64.deb "$KDIR"
  depmod -b "$KDIR" "$KVER"
  touch "$KDIR/.done"
fi
MODROOT=$KDIR/lib/modules/$KVER

# ---------------------------------------------------------------- 2. rootfs (debootstrap, cached)
ROOTFS=$CACHE/rootfs
WANT="$SUITE ${GUEST_PKGS[*]}"
if [[ $FORCE == 1 || "$(cat "$ROOTFS/.debootstrap-done" 2>/dev/null)" != "$WANT" ]]; then
  log "debootstrap --variant=minbase $SUITE (+ ${GUEST_PKGS[*]})"
  rm -rf "$ROOTFS"
  t=$(date +%s)
  debootstrap --variant=minbase --include="$(IFS=,; echo "${GUEST_PKGS[*]}")" \
    "$SUITE" "$ROOTFS" "$MIRROR" > "$CACHE/debootstrap.log" 2>&1 || {
      tail -30 "$CACHE/debootstrap.log" >&2; exit 1; }
  log "debootstrap took $(( $(date +%s) - t )) s"
  echo "$WANT" > "$ROOTFS/.debootstrap-done"
fi

# ---------------------------------------------------------------- stamp: skip when unchanged
STAMP=$( { echo "$KVER $WANT ${GUEST_MODS[*]} ${INITRD_MODS[*]}"; cat "$HERE/build-guest.sh" "$HERE/guest/initrd-init" "$HERE/guest/init"; } | sha256sum | cut -d' ' -f1)
G=$CACHE/guest
if [[ $FORCE == 0 && -f $G/vmlinuz && -f $G/initrd.img && -f $G/rootfs.img && "$(cat "$G/stamp" 2>/dev/null)" == "$STAMP" ]]; then
  log "guest image up to date ($G)"
  exit 0
fi
rm -f "$G/stamp"
cp -f "$KDIR/boot/vmlinuz-$KVER" "$G/vmlinuz"

# Module files (relative to $MODROOT) needed for a set of modules, in load order.
mod_files() {
  local m
  for m in "$@"; do
    modprobe -d "$KDIR" -S "$KVER" --show-depends "$m" | awk '$1=="insmod"{print $2}'
  done | sed "s#^$MODROOT/##" | awk '!seen[$0]++'
}

# ---------------------------------------------------------------- 3. customise the rootfs
log "customising rootfs"
rm -rf "$ROOTFS"/usr/share/{doc,man,info,locale,lintian,linda}/* \
       "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb \
       "$ROOTFS"/var/lib/apt/lists/*_Packages 2>/dev/null || true
rm -rf "$ROOTFS/lib/modules"; mkdir -p "$ROOTFS/lib/modules/$KVER"
cp "$MODROOT"/modules.{order,builtin,builtin.modinfo} "$ROOTFS/lib/modules/$KVER/"
mod_files "${GUEST_MODS[@]}" "${INITRD_MODS[@]}" | while read -r f; do
  mkdir -p "$ROOTFS/lib/modules/$KVER/$(dirname "$f")"
  cp "$MODROOT/$f" "$ROOTFS/lib/modules/$KVER/$f"
done
for d in kernel/drivers/infiniband/core kernel/drivers/infiniband/sw kernel/net/sched; do
  mkdir -p "$ROOTFS/lib/modules/$KVER/$d"; cp -r "$MODROOT/$d/." "$ROOTFS/lib/modules/$KVER/$d/"
done
depmod -b "$ROOTFS" "$KVER"
install -m 0755 "$HERE/guest/init" "$ROOTFS/sbin/softroce-interop-init"
echo rxe-guest > "$ROOTFS/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 rxe-guest\n' > "$ROOTFS/etc/hosts"
mkdir -p "$ROOTFS/share"
{
  echo "kernel: $KDEB_PKG ($(dpkg-deb -f "$CACHE"/debs/"$KDEB_PKG"_*_amd64.deb Version))"
  chroot "$ROOTFS" dpkg-query -W -f '${Package} ${Version}\n' \
    rdma-core ibverbs-providers ibverbs-utils libibverbs1 librdmacm1 perftest rdmacm-utils \
    infiniband-diags iproute2 tcpdump python3 python3-pyverbs libucx0 ucx-utils \
    openmpi-bin libopenmpi3 libpmix2
} > "$G/manifest.txt"
chroot "$ROOTFS" dpkg-query -W -f '${Package} ${Version}\n' > "$G/packages.txt"

# ---------------------------------------------------------------- 4. ext4 image (no loop mount)
IMG=$G/rootfs.img
SIZE_MB=$(( $(du -sm "$ROOTFS" | cut -f1) * 13 / 10 + 64 ))
log "mke2fs -d rootfs -> rootfs.img (${SIZE_MB} MiB)"
rm -f "$IMG"
mke2fs -q -t ext4 -O ^metadata_csum,^has_journal -L rxeroot -d "$ROOTFS" "$IMG" "${SIZE_MB}M"

# ---------------------------------------------------------------- 5. initramfs
IRD=$CACHE/initrd-tree
rm -rf "$IRD"; mkdir -p "$IRD"/{bin,dev,proc,sys,newroot,mods}
cp "$(command -v busybox)" "$IRD/bin/busybox"
for a in sh mount umount insmod switch_root sleep mkdir cat echo cut; do ln -s busybox "$IRD/bin/$a"; done
: > "$IRD/mods/order"
mod_files "${INITRD_MODS[@]}" | grep -v crc32c-intel | while read -r f; do
  cp "$MODROOT/$f" "$IRD/mods/"; basename "$f" >> "$IRD/mods/order"
done
install -m 0755 "$HERE/guest/initrd-init" "$IRD/init"
(cd "$IRD" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) > "$G/initrd.img"

echo "$STAMP" > "$G/stamp"
log "guest built in $(( $(date +%s) - T0 )) s: $(du -sh --apparent-size "$IMG" | cut -f1) rootfs image"
cat "$G/manifest.txt" >&2
