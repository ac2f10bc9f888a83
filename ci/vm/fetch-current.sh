#!/bin/bash
# The second guest kernel: the newest one Debian ships (linux-image-amd64 of
# trixie-backports, else trixie), unpacked into $VM_CACHE/kernel-current (nothing is
# installed on the host) through a private apt configuration in $VM_CACHE/current-apt. Newer
# Debian kernels come split (linux-binary-KVER: vmlinuz; linux-modules-KVER: modules as
# .ko.xz; linux-base-KVER: config, modules.builtin); the older layout (one linux-image-KVER
# package) is read too. Modules are decompressed (busybox insmod in the guest loads plain .ko)
# and busybox depmod writes modules.dep; vmlinuz's payload (zstd or xz) becomes the ELF
# vmlinux QEMU boots through PVH. Reuses what a previous run left; remove the directory to
# pick up a newer kernel.
#   MRCACHE_VM_CACHE  cache directory (default ~/.cache/mrcache-vm)
set -euo pipefail
. "$(dirname "$0")/common.sh"
KROOT=$VM_CACHE/kernel-current
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ -f "$KROOT/.complete" ]; then
  vm_log "fetch-current: reusing $KROOT (kernel $(cat "$KROOT/KVER"))"
  exit 0
fi
need apt-get; need dpkg-deb; need python3; need xz; need zstd
[ -x "$SYSROOT/bin/busybox" ] || vm_die "$RC_SETUP" "fetch-current: no busybox in $SYSROOT (run ci/vm/fetch.sh)"
APT=$VM_CACHE/current-apt
apt_cur() {  # apt-get (apt-cache for show/madison) on Debian 13's amd64 lists, apart from the host's
  local tool=apt-get
  case $1 in show|madison) tool=apt-cache ;; esac
  "$tool" -q -o APT::Architecture=amd64 -o APT::Architectures::=amd64 \
    -o Dir::Etc::SourceList="$APT/sources.list" -o Dir::Etc::SourceParts=/dev/null \
    -o Dir::State::Lists="$APT/lists" -o Dir::State::Status="$APT/status" \
    -o Dir::Cache="$APT/cache" "$@"
}
mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial"
: > "$APT/status"
printf 'deb %s trixie main\ndeb %s trixie-backports main\n' "$MIRROR" "$MIRROR" > "$APT/sources.list"
apt_cur update 2>&1 | grep -v 'unsandboxed' >&2 ||
  true
# The highest version of the metapackage, and the versioned image package it depends on.
meta=$(apt_cur madison linux-image-amd64 | awk -F'|' '{gsub(/ /, "", $2); print $2}' | sort -V | tail -1)
[ -n "$meta" ] || vm_die "$RC_SETUP" "fetch-current: no linux-image-amd64 in Debian 13's lists (apt-get update failed?)"
image=$(apt_cur show "linux-image-amd64=$meta" 2>/dev/null |
  awk '/^Depends:/ { n = split($0, d, ","); for (i = 1; i <= n; i++) if (match(d[i], /linux-image-[0-9][^ ]*/)) { print substr(d[i], RSTART, RLENGTH); exit } }')
[ -n "$image" ] || vm_die "$RC_SETUP" "fetch-current: linux-image-amd64 $meta names no versioned image package"
KVER=${image#linux-image-}
vm_log "fetch-current: kernel $KVER (linux-image-amd64 $meta) into $KROOT"
debs=$VM_CACHE/current-debs
rm -rf "$debs" "$KROOT"; mkdir -p "$debs" "$KROOT"
# The split packages where they exist, else the image package carries everything.
pkgs=("$image")
for p in linux-binary-$KVER linux-modules-$KVER linux-base-$KVER; do
  apt_cur show "$p" > /dev/null 2>&1 && pkgs+=("$p")
done
( cd "$debs" && apt_cur download "${pkgs[@]}" 2>&1 | grep -v 'unsandboxed' >&2 ) || true
for p in "${pkgs[@]}"; do
  ls "$debs/${p}_"*.deb > /dev/null 2>&1 || vm_die "$RC_SETUP" "fetch-current: package $p was not downloaded"
done
for d in "$debs"/*.deb; do dpkg-deb -x "$d" "$KROOT"; done
# Modules under lib/modules/KVER whether the package put them in /lib or /usr/lib.
if [ -d "$KROOT/usr/lib/modules/$KVER" ]; then
  mkdir -p "$KROOT/lib/modules"
  mv "$KROOT/usr/lib/modules/$KVER" "$KROOT/lib/modules/$KVER"
fi
mods=$KROOT/lib/modules/$KVER
[ -d "$mods/kernel" ] || vm_die "$RC_SETUP" "fetch-current: no modules in the packages of $KVER"
find "$mods" -name '*.ko.xz' -print0 | xargs -0 -r -P2 -n64 xz -d
"$SYSROOT/bin/busybox" depmod -b "$KROOT" "$KVER"
vmlinuz=
for f in "$mods/vmlinuz" "$KROOT/boot/vmlinuz-$KVER"; do [ -f "$f" ] && { vmlinuz=$f; break; }; done
[ -n "$vmlinuz" ] || vm_die "$RC_SETUP" "fetch-current: no vmlinuz in the packages of $KVER"
python3 - "$vmlinuz" "$KROOT/vmlinux" <<'PY'
import lzma, subprocess, sys
data = open(sys.argv[1], "rb").read()
zstd, xz = data.find(b"\x28\xb5\x2f\xfd"), data.find(b"\xfd7zXZ\x00")
if xz >= 0 and (zstd < 0 or xz < zstd):
    elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[xz:])
elif zstd >= 0:
    # zstd stops with an error at the bzImage's data after the frame; the frame is complete.
    elf = subprocess.run(["zstd", "-dcq"], input=data[zstd:], capture_output=True).stdout
else:
    sys.exit("vmlinuz: neither an xz nor a zstd payload")
assert elf[:4] == b"\x7fELF", "decompressed kernel is not an ELF image"
open(sys.argv[2], "wb").write(elf)
PY
grep -qs '^CONFIG_PVH=y' "$mods/config" "$KROOT/boot/config-$KVER" ||
  vm_die "$RC_SETUP" "fetch-current: kernel $KVER is not built with CONFIG_PVH (QEMU boots the ELF vmlinux through PVH)"
echo "$KVER" > "$KROOT/KVER"
rm -rf "$debs"
touch "$KROOT/.complete"
vm_log "fetch-current: done, kernel $KVER, ODP: $(cat "$mods/config" "$KROOT/boot/config-$KVER" 2>/dev/null | grep '^CONFIG_INFINIBAND_ON_DEMAND_PAGING' || true)"
