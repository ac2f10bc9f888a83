#!/bin/bash
# Build a Debian 13 (trixie) root filesystem from Debian packages: glibc 2.41, trixie's
# libibverbs1, ibverbs-providers and librdmacm1. The second-glibc run (ci/glibc2) chroots
# into it inside the guest and runs the host-built stale scenarios against that userland.
# Cached in the VM cache next to the sysroot and reused; built in a temporary directory and
# renamed into place with a .complete stamp last, so an interrupted build leaves nothing that
# looks finished and the next run starts over. Prints the root's path on stdout.
#   MRCACHE_VM_CACHE  cache directory (default ~/.cache/mrcache-vm)
#   TRIXIE_MIRROR     Debian mirror (default http://deb.debian.org/debian)
set -euo pipefail
. "$(dirname "$0")/common.sh"

if [ -f "$TRIXIE_ROOT/.complete" ]; then
  vm_log "trixie root: reusing $TRIXIE_ROOT ($(cat "$TRIXIE_ROOT/.complete"))"
  echo "$TRIXIE_ROOT"
  exit 0
fi
[ "$(id -u)" = 0 ] || vm_die "$RC_SETUP" "trixie root: mmdebstrap needs root to build $TRIXIE_ROOT"
if ! command -v mmdebstrap >/dev/null; then
  vm_log "trixie root: installing mmdebstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap >/dev/null ||
    vm_die "$RC_SETUP" "trixie root: cannot install mmdebstrap"
fi
keyring=/usr/share/keyrings/debian-archive-trixie-stable.gpg
[ -f "$keyring" ] || vm_die "$RC_SETUP" "trixie root: $keyring missing (debian-archive-keyring too old)"

tmp=$TRIXIE_ROOT.tmp
# A build killed half-way may have left its bind mounts behind: undo them before removing,
# and never cross into another file system while removing.
cleanup() {
  findmnt -rn -o TARGET | grep -F "$tmp/" | sort -r | while read -r m; do umount -l "$m" || true; done || true
  rm -rf --one-file-system "$tmp"
}
cleanup
trap cleanup EXIT
rm -rf --one-file-system "$TRIXIE_ROOT"
mkdir -p "$VM_CACHE"
vm_log "trixie root: building $TRIXIE_ROOT with mmdebstrap"
# essential = Priority: required (libc6, dash, coreutils, grep, ...); plus the verbs stack
# and what the host-built test programs and libmrcache.so link against.
mmdebstrap --quiet --variant=essential --keyring="$keyring" \
  --include=libibverbs1,ibverbs-providers,librdmacm1,libgcc-s1 \
  --dpkgopt='path-exclude=/usr/share/{doc,man,locale,info}/*' \
  trixie "$tmp" "${TRIXIE_MIRROR:-http://deb.debian.org/debian}" >&2 ||
  vm_die "$RC_SETUP" "trixie root: mmdebstrap failed"
glibc=$(chroot "$tmp" dpkg-query -W -f='${Version}' libc6)
verbs=$(chroot "$tmp" dpkg-query -W -f='${Version}' libibverbs1)
case $glibc in 2.41*) ;; *) vm_die "$RC_SETUP" "trixie root: libc6 is $glibc, expected 2.41";; esac
rm -rf "$tmp/var/cache/apt/archives"/*.deb "$tmp/var/lib/apt/lists"/*_Packages
echo "libc6 $glibc, libibverbs1 $verbs" > "$tmp/.versions"
mv "$tmp" "$TRIXIE_ROOT"
trap - EXIT
echo "libc6 $glibc, libibverbs1 $verbs" > "$TRIXIE_ROOT/.complete"
vm_log "trixie root: done, libc6 $glibc, libibverbs1 $verbs"
echo "$TRIXIE_ROOT"
