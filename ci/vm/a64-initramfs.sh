#!/bin/bash
# The aarch64 guest's initramfs: Debian 12's busybox-static:arm64, the arm64 kernel's modules
# that rxe, 9p over virtio-pci and the dummy netdev need (dependency closure from modules.dep,
# in load order) and ci/vm/a64-init. The userland the cases run in is the Debian 13 arm64
# root ($VM_CACHE/a64-root, ci/vm/a64-fetch.sh), reached over 9p through the host's root.
set -euo pipefail
. "$(dirname "$0")/common.sh"
A64_SYSROOT=$VM_CACHE/a64-sysroot
A64_INITRAMFS=$VM_CACHE/a64-initramfs.cpio.gz
[ -f "$A64_SYSROOT/.complete" ] || vm_die "$RC_SETUP" "a64-initramfs: no $A64_SYSROOT; run ci/vm/a64-fetch.sh first"
KVER=$(cat "$A64_SYSROOT/KVER")
MODS=$A64_SYSROOT/arm64/lib/modules/$KVER
stamp=$(cat "$VM_DIR/a64-init" "$0" "$A64_SYSROOT/KVER" | sha256sum | cut -c1-16)
if [ -f "$A64_INITRAMFS" ] && [ "$(cat "$A64_INITRAMFS.stamp" 2>/dev/null)" = "$stamp" ]; then
  vm_log "a64-initramfs: reusing $A64_INITRAMFS"
  exit 0
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,proc,sys,dev,tmp,run,hostroot,lower,scratch,etc,lib/modules/"$KVER"}
cp "$A64_SYSROOT/arm64/bin/busybox" "$root/bin/busybox"
# The arm64 busybox cannot list its applets on this host: the host's x86 busybox gives the
# names (the same Debian 12 build); a name the arm64 one lacks fails loudly at use.
for applet in $("$SYSROOT/bin/busybox" --list); do
  [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done
ln -s bin "$root/sbin"
want="rdma_rxe ib_uverbs rdma_ucm crc32_generic dummy virtio_pci 9pnet_virtio 9p overlay"
declare -A seen
add_module() {
  local m=$1 dep
  [ -n "${seen[$m]:-}" ] && return
  seen[$m]=1
  for dep in $(awk -v m="$m:" '$1 == m { for (i = 2; i <= NF; i++) print $i }' "$MODS/modules.dep"); do
    add_module "$dep"
  done
  mkdir -p "$root/lib/modules/$KVER/$(dirname "$m")"
  cp "$MODS/$m" "$root/lib/modules/$KVER/$m"
  echo "$m" >> "$root/etc/modules"
}
: > "$root/etc/modules"
for w in $want; do
  path=$(awk -F: -v n="/$w.ko" 'substr($1, length($1) - length(n) + 1) == n { print $1; exit }' "$MODS/modules.dep")
  [ -n "$path" ] || vm_die "$RC_SETUP" "a64-initramfs: module $w not found in kernel $KVER"
  add_module "$path"
done
echo "$KVER" > "$root/etc/kver"
cp "$VM_DIR/a64-init" "$root/init"
chmod +x "$root/init"
( cd "$root" && find . | "$SYSROOT/bin/busybox" cpio -o -H newc -R 0:0 2>/dev/null ) | gzip -1 > "$A64_INITRAMFS.tmp"
mv "$A64_INITRAMFS.tmp" "$A64_INITRAMFS"
echo "$stamp" > "$A64_INITRAMFS.stamp"
vm_log "a64-initramfs: $A64_INITRAMFS ($(du -h "$A64_INITRAMFS" | cut -f1), $(wc -l < "$root/etc/modules") modules)"
