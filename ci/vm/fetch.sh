#!/bin/bash
# Fetch Debian 12's guest kernel, QEMU and busybox as .debs and unpack them into the VM cache,
# without installing them: installing qemu-system-x86 would replace the host's backported
# qemu-utils and pull in a udev/systemd upgrade. Reuses what a previous run left.
#   MRCACHE_VM_CACHE  cache directory (default ~/.cache/mrcache-vm)
set -euo pipefail
. "$(dirname "$0")/common.sh"

current() {  # the second kernel, when MRCACHE_VM_KERNEL=current asks for it
  [ "$VM_KERNEL" = current ] || return 0
  bash "$VM_DIR/fetch-current.sh"
}
if [ -f "$SYSROOT/.complete" ]; then
  vm_log "fetch: reusing $SYSROOT (kernel $(cat "$SYSROOT/KVER"))"
  current; exit
fi
need apt-get; need dpkg-deb; need python3
KVER=${KVER:-$(apt-cache depends linux-image-amd64 2>/dev/null |
  awk '/Depends: linux-image-[0-9]/ {sub("linux-image-", "", $2); print $2; exit}')}
[ -n "$KVER" ] || vm_die 2 "fetch: cannot resolve the kernel version from linux-image-amd64 (run apt-get update?)"
vm_log "fetch: kernel $KVER into $VM_CACHE"
mkdir -p "$VM_CACHE/debs"
rm -rf "$SYSROOT"; mkdir -p "$SYSROOT"
pkgs=(linux-image-$KVER qemu-system-x86 qemu-system-common qemu-system-data seabios
      busybox-static libcapstone4 libfdt1 libpmem1 libndctl6 libdaxctl1 libslirp0 libvdeplug2)
( cd "$VM_CACHE/debs" && apt-get download -q "${pkgs[@]}" 2>&1 | grep -v 'Download is performed unsandboxed' ) ||
  true
for p in "${pkgs[@]}"; do
  ls "$VM_CACHE/debs/${p}_"*.deb >/dev/null 2>&1 || vm_die 2 "fetch: package $p was not downloaded"
done
for d in "$VM_CACHE"/debs/*.deb; do dpkg-deb -x "$d" "$SYSROOT"; done
# The kernel package's postinst normally writes modules.dep; busybox depmod does it without kmod.
"$SYSROOT/bin/busybox" depmod -b "$SYSROOT" "$KVER"
echo "$KVER" > "$SYSROOT/KVER"
# An uncompressed ELF vmlinux boots through PVH, skipping SeaBIOS and the in-guest xz
# decompression (about 5 s under TCG).
python3 - "$SYSROOT/boot/vmlinuz-$KVER" "$SYSROOT/vmlinux" <<'PY'
import lzma, sys
data = open(sys.argv[1], "rb").read()
start = data.find(b"\xfd7zXZ\x00")
elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[start:])
assert elf[:4] == b"\x7fELF", "decompressed kernel is not an ELF image"
open(sys.argv[2], "wb").write(elf)
PY
if LD_LIBRARY_PATH=$QEMU_LIBS ldd "$QEMU" | grep 'not found'; then
  vm_die 2 "fetch: QEMU is missing shared libraries (listed above)"
fi
rm -rf "$VM_CACHE/debs"
touch "$SYSROOT/.complete"
vm_log "fetch: done, $(LD_LIBRARY_PATH=$QEMU_LIBS "$QEMU" --version | head -1)"
current
