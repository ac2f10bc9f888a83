#!/bin/bash
# The aarch64 soft-RoCE guest's parts, as Debian packages unpacked into the VM cache (nothing
# is installed on the host). Reuses what a previous run left (each part has a .complete stamp).
#   $VM_CACHE/a64-sysroot  qemu-system-aarch64 (Debian 12's qemu-system-arm, amd64, and the
#                          libraries ci/vm/fetch.sh unpacks for the x86 QEMU), Debian 12's arm64
#                          kernel (linux-image-arm64: rdma_rxe is a module) as an uncompressed
#                          Image, and Debian 12's busybox-static:arm64 for the initramfs
#   $VM_CACHE/a64-root     the guest's userland: Debian 13 arm64 (glibc 2.41, the one the
#                          cross build links against) with libibverbs1, ibverbs-providers
#                          (rxe), ibverbs-utils, rdmacm-utils, perftest, iproute2 (`rdma`),
#                          librdmacm-dev (the C test programs link -lrdmacm), busybox-static
#                          for the shell and tools; extracted (mmdebstrap --variant=extract,
#                          no maintainer scripts run, so no qemu-user is needed)
# The arm64 packages of Debian 12 come through a private apt configuration under
# $VM_CACHE/a64-apt (its own lists and an empty dpkg status): the host's apt is not touched.
#   MRCACHE_VM_CACHE  cache directory (default ~/.cache/mrcache-vm)
set -euo pipefail
. "$(dirname "$0")/common.sh"
A64_SYSROOT=$VM_CACHE/a64-sysroot
A64_ROOT=$VM_CACHE/a64-root
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
need apt-get; need dpkg-deb; need python3
# The x86 parts first: their busybox writes the arm64 modules.dep here and lists the applets
# for the aarch64 initramfs (the host has none of its own).
[ -f "$SYSROOT/.complete" ] || bash "$VM_DIR/fetch.sh" || vm_die "$RC_SETUP" "a64-fetch: ci/vm/fetch.sh (the x86 parts) failed"

# apt_arm64 ARGS...: apt-get (apt-cache for depends) on Debian 12's arm64 lists, kept apart from the host's.
APT=$VM_CACHE/a64-apt
apt_arm64() {
  local tool=apt-get
  [ "$1" = depends ] && tool=apt-cache
  "$tool" -q -o APT::Architecture=arm64 -o APT::Architectures::=arm64 \
    -o Dir::Etc::SourceList="$APT/sources.list" -o Dir::Etc::SourceParts=/dev/null \
    -o Dir::State::Lists="$APT/lists" -o Dir::State::Status="$APT/status" \
    -o Dir::Cache="$APT/cache" "$@"
}

if [ -f "$A64_SYSROOT/.complete" ]; then
  vm_log "a64-fetch: reusing $A64_SYSROOT (kernel $(cat "$A64_SYSROOT/KVER"))"
else
  mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial"
  : > "$APT/status"
  echo "deb $MIRROR bookworm main" > "$APT/sources.list"
  apt_arm64 update >&2 || vm_die "$RC_SETUP" "a64-fetch: apt-get update of Debian 12's arm64 lists failed"
  KVER=$(apt_arm64 depends linux-image-arm64 2>/dev/null |
    awk '/Depends: linux-image-[0-9]/ {sub("linux-image-", "", $2); print $2; exit}')
  [ -n "$KVER" ] || vm_die "$RC_SETUP" "a64-fetch: cannot resolve the kernel version from linux-image-arm64"
  vm_log "a64-fetch: kernel $KVER (arm64), qemu-system-arm into $A64_SYSROOT"
  debs=$VM_CACHE/a64-debs
  rm -rf "$debs" "$A64_SYSROOT"; mkdir -p "$debs/host" "$debs/arm64" "$A64_SYSROOT/arm64"
  hostpkgs=(qemu-system-arm qemu-system-common qemu-system-data libcapstone4 libfdt1 libpmem1
    libndctl6 libdaxctl1 libslirp0 libvdeplug2)
  ( cd "$debs/host" && apt-get download -q "${hostpkgs[@]}" 2>&1 | grep -v 'Download is performed unsandboxed' ) || true
  ( cd "$debs/arm64" && apt_arm64 download "linux-image-$KVER" busybox-static 2>&1 | grep -v 'Download is performed unsandboxed' ) || true
  for p in "${hostpkgs[@]}"; do
    ls "$debs/host/${p}_"*.deb >/dev/null 2>&1 || vm_die "$RC_SETUP" "a64-fetch: package $p was not downloaded"
  done
  for p in "linux-image-$KVER" busybox-static; do
    ls "$debs/arm64/${p}_"*arm64.deb >/dev/null 2>&1 || vm_die "$RC_SETUP" "a64-fetch: package $p:arm64 was not downloaded"
  done
  for d in "$debs"/host/*.deb; do dpkg-deb -x "$d" "$A64_SYSROOT"; done
  for d in "$debs"/arm64/*.deb; do dpkg-deb -x "$d" "$A64_SYSROOT/arm64"; done
  # The host's busybox writes modules.dep for the arm64 modules (the format has no arch).
  busybox=$(ls "$SYSROOT/bin/busybox" 2>/dev/null || command -v busybox || true)
  [ -n "$busybox" ] || vm_die "$RC_SETUP" "a64-fetch: no host busybox for depmod (run ci/vm/fetch.sh first)"
  "$busybox" depmod -b "$A64_SYSROOT/arm64" "$KVER"
  echo "$KVER" > "$A64_SYSROOT/KVER"
  # Debian's arm64 vmlinuz is a gzip'd Image: QEMU would inflate it at every boot.
  python3 - "$A64_SYSROOT/arm64/boot/vmlinuz-$KVER" "$A64_SYSROOT/Image" <<'PY'
import gzip, sys
data = open(sys.argv[1], "rb").read()
image = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
assert image[56:60] == b"ARM\x64", "not an arm64 kernel Image (no ARM\\x64 magic at 56)"
open(sys.argv[2], "wb").write(image)
PY
  qemu=$A64_SYSROOT/usr/bin/qemu-system-aarch64
  libs=$A64_SYSROOT/usr/lib/x86_64-linux-gnu:$A64_SYSROOT/lib/x86_64-linux-gnu
  if LD_LIBRARY_PATH=$libs ldd "$qemu" | grep 'not found'; then
    vm_die "$RC_SETUP" "a64-fetch: qemu-system-aarch64 is missing shared libraries (listed above)"
  fi
  rm -rf "$debs"
  touch "$A64_SYSROOT/.complete"
  vm_log "a64-fetch: $(LD_LIBRARY_PATH=$libs "$qemu" --version | head -1), kernel Image $(du -h "$A64_SYSROOT/Image" | cut -f1)"
fi

if [ -f "$A64_ROOT/.complete" ]; then
  vm_log "a64-fetch: reusing $A64_ROOT ($(head -1 "$A64_ROOT/.complete"))"
  exit 0
fi
need mmdebstrap
keyring=/usr/share/keyrings/debian-archive-trixie-stable.gpg
[ -f "$keyring" ] || vm_die "$RC_SETUP" "a64-fetch: $keyring missing (debian-archive-keyring too old)"
pkgs=libc6,libibverbs1,ibverbs-providers,ibverbs-utils,librdmacm1,rdmacm-utils,perftest,iproute2,librdmacm-dev,libibverbs-dev,busybox-static
t=$SECONDS
vm_log "a64-fetch: extracting the Debian 13 arm64 userland into $A64_ROOT"
rm -rf "$A64_ROOT" "$A64_ROOT.tmp"; mkdir -p "$A64_ROOT.tmp"
mmdebstrap --quiet --variant=extract --architectures=arm64 --keyring="$keyring" --include="$pkgs" \
  --dpkgopt='path-exclude=/usr/share/{doc,man,locale,info}/*' \
  trixie "$A64_ROOT.tmp" "$MIRROR" >&2 || vm_die "$RC_SETUP" "a64-fetch: mmdebstrap (arm64 userland) failed"
r=$A64_ROOT.tmp
# Merged /usr (base-files makes these links; an extract runs no package's scripts).
for d in bin sbin lib; do [ -e "$r/$d" ] || ln -s "usr/$d" "$r/$d"; done
# busybox for every tool the case scripts use that no extracted package gave (sh, grep,
# awk, timeout, ...).
for applet in $("$r/usr/bin/busybox" --list 2>/dev/null || chroot "$r" /usr/bin/busybox --list 2>/dev/null ||
                "$SYSROOT/bin/busybox" --list); do
  [ -e "$r/usr/bin/$applet" ] || [ -e "$r/usr/sbin/$applet" ] || ln -s busybox "$r/usr/bin/$applet"
done
mkdir -p "$r/proc" "$r/sys" "$r/dev" "$r/tmp" "$r/run" "$r/etc"
chmod 1777 "$r/tmp"
[ -s "$r/etc/passwd" ] || echo 'root:x:0:0:root:/root:/bin/sh' > "$r/etc/passwd"
[ -s "$r/etc/group" ] || echo 'root:x:0:' > "$r/etc/group"
ls "$r"/usr/lib/aarch64-linux-gnu/libibverbs/librxe-rdmav*.so >/dev/null 2>&1 ||
  vm_die "$RC_SETUP" "a64-fetch: the arm64 userland has no rxe provider (ibverbs-providers)"
printf 'extracted %s in %ss\npackages %s\n' "$(date -u)" "$((SECONDS - t))" "$pkgs" > "$r/.complete"
mv "$r" "$A64_ROOT"
vm_log "a64-fetch: $A64_ROOT in $((SECONDS - t)) s ($(du -sm "$A64_ROOT" | cut -f1) MiB)"
