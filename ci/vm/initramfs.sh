#!/bin/bash
# Build the guest initramfs: static busybox, the kernel modules rxe and 9p need (dependency
# closure from modules.dep, in load order) and ci/vm/init. Everything else the guest runs
# comes from the host's root filesystem, shared read-only over 9p. (vm_initramfs in
# common.sh, shared with ci/vm/a64-initramfs.sh.)
set -euo pipefail
. "$(dirname "$0")/common.sh"
[ -f "$SYSROOT/.complete" ] && [ -f "$KROOT/.complete" ] ||
  vm_die "$RC_SETUP" "initramfs: no $VM_KERNEL kernel in $VM_CACHE; run ci/vm/fetch.sh first"
KVER=$(cat "$KROOT/KVER")
vm_initramfs "initramfs ($VM_KERNEL kernel)" "$INITRAMFS" "$VM_DIR/init" "$KVER" "$KROOT/lib/modules/$KVER" \
  "$SYSROOT/bin/busybox" "$SYSROOT/bin/busybox"
