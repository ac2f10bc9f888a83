#!/bin/bash
# The aarch64 guest's initramfs: Debian 12's busybox-static:arm64, the arm64 kernel's modules
# that rxe, 9p over virtio-pci and the dummy netdev need (dependency closure from modules.dep,
# in load order) and ci/vm/a64-init. The userland the cases run in is the Debian 13 arm64
# root ($VM_CACHE/a64-root, ci/vm/a64-fetch.sh), reached over 9p through the host's root.
# The arm64 busybox cannot list its applets on this host: the host's x86 busybox (the same
# Debian 12 build) gives the names. (vm_initramfs in common.sh, shared with initramfs.sh.)
set -euo pipefail
. "$(dirname "$0")/common.sh"
A64_SYSROOT=$VM_CACHE/a64-sysroot
[ -f "$A64_SYSROOT/.complete" ] || vm_die "$RC_SETUP" "a64-initramfs: no $A64_SYSROOT; run ci/vm/a64-fetch.sh first"
[ -x "$SYSROOT/bin/busybox" ] || vm_die "$RC_SETUP" "a64-initramfs: no $SYSROOT/bin/busybox (the x86 parts); run ci/vm/a64-fetch.sh first"
KVER=$(cat "$A64_SYSROOT/KVER")
vm_initramfs a64-initramfs "$VM_CACHE/a64-initramfs.cpio.gz" "$VM_DIR/a64-init" "$KVER" \
  "$A64_SYSROOT/arm64/lib/modules/$KVER" "$A64_SYSROOT/arm64/bin/busybox" "$SYSROOT/bin/busybox"
