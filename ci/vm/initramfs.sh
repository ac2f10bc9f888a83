#!/bin/bash
# Build the guest initramfs: static busybox, the kernel modules rxe and 9p need (dependency
# closure from modules.dep, in load order) and ci/vm/init. Everything else the guest runs
# comes from the host's root filesystem, shared read-only over 9p.
set -euo pipefail
. "$(dirname "$0")/common.sh"
[ -f "$SYSROOT/.complete" ] || vm_die "$RC_SETUP" "initramfs: no sysroot in $VM_CACHE; run ci/vm/fetch.sh first"
KVER=$(cat "$SYSROOT/KVER")
MODS=$SYSROOT/lib/modules/$KVER
stamp=$(cat "$VM_DIR/init" "$0" "$SYSROOT/KVER" | sha256sum | cut -c1-16)
if [ -f "$INITRAMFS" ] && [ "$(cat "$INITRAMFS.stamp" 2>/dev/null)" = "$stamp" ]; then
  vm_log "initramfs: reusing $INITRAMFS"
  exit 0
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,proc,sys,dev,tmp,run,hostroot,lower,scratch,etc,lib/modules/"$KVER"}
cp "$SYSROOT/bin/busybox" "$root/bin/busybox"
for applet in $("$root/bin/busybox" --list); do
  [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done
ln -s bin "$root/sbin"

# Modules: what rxe, rdma_cm, the dummy netdev and 9p over virtio need, dependencies first.
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
  [ -n "$path" ] || vm_die "$RC_SETUP" "initramfs: module $w not found in kernel $KVER"
  add_module "$path"
done
echo "$KVER" > "$root/etc/kver"
cp "$VM_DIR/init" "$root/init"
chmod +x "$root/init"
( cd "$root" && find . | "$root/bin/busybox" cpio -o -H newc -R 0:0 2>/dev/null ) | gzip -1 > "$INITRAMFS.tmp"
mv "$INITRAMFS.tmp" "$INITRAMFS"
echo "$stamp" > "$INITRAMFS.stamp"
vm_log "initramfs: $INITRAMFS ($(du -h "$INITRAMFS" | cut -f1), $(wc -l < "$root/etc/modules") modules)"
