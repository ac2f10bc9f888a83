#!/bin/bash
# Boot the aarch64 soft-RoCE guest (qemu-system-aarch64 -M virt -cpu max, TCG: BTI and PAC
# are on, Debian 12's arm64 kernel, rxe on a dummy netdev) and run commands in it.
#
#   ci/vm/a64-run.sh [-j JOBDIR] [COMMAND...]
#
# As ci/vm/run.sh, but each COMMAND runs in a chroot of the Debian 13 arm64 root
# ($VM_CACHE/a64-root) with this checkout and JOBDIR bound in at their host paths, so the
# cross-built libmrcache.so and test programs run at the paths they have here. Parts:
# ci/vm/a64-fetch.sh, ci/vm/a64-initramfs.sh (run by this script when missing).
#
# Environment: TIMEOUT (host-side limit in s, default 1800: the whole suite took 450 s of guest time at load 4 here), COMMAND_TIMEOUT (per command,
# default 300), MEM (MiB, default 2048), SMP (default 2), HUGEPAGES (default 0),
# MRCACHE_VM_INJECT=panic|hang|linkadd (exercise the rig's failure paths).
# Exit status: 0 all commands passed, 1 some failed, otherwise see common.sh (124 hang,
# 125 panic/crash, 126 inconsistent result, 127 missing result, 90-94 guest setup).
set -uo pipefail
. "$(dirname "$0")/common.sh"

JOB=
if [ "${1:-}" = -j ]; then JOB=$2; shift 2; fi
[ -n "$JOB" ] || { mkdir -p "$VM_CACHE/jobs"; JOB=$(mktemp -d "$VM_CACHE/jobs/job.XXXXXX"); }
mkdir -p "$JOB"; JOB=$(cd "$JOB" && pwd)
if [ $# -gt 0 ]; then printf '%s\n' "$@" > "$JOB/commands"; fi
[ -s "$JOB/commands" ] || vm_die "$RC_SETUP" "no commands: give them as arguments or in $JOB/commands"
A64_SYSROOT=$VM_CACHE/a64-sysroot
A64_ROOT=$VM_CACHE/a64-root
A64_INITRAMFS=$VM_CACHE/a64-initramfs.cpio.gz
bash "$VM_DIR/a64-fetch.sh" || vm_die "$RC_SETUP" "ci/vm/a64-fetch.sh failed"
bash "$VM_DIR/a64-initramfs.sh" || vm_die "$RC_SETUP" "ci/vm/a64-initramfs.sh failed"
QEMU=$A64_SYSROOT/usr/bin/qemu-system-aarch64
QEMU_LIBS=$A64_SYSROOT/usr/lib/x86_64-linux-gnu:$A64_SYSROOT/lib/x86_64-linux-gnu
REPO=$(cd "$VM_DIR/../.." && pwd)
rm -rf "$JOB/results" "$JOB/vm.rc"
echo "$VM_DIR/guest-run.sh" > "$JOB/runner"  # busybox sh runs it in the arm64 root
echo "${COMMAND_TIMEOUT:-300}" > "$JOB/command-timeout"

append="console=ttyAMA0 panic=-1 oops=panic quiet loglevel=4 mrcache.job=$JOB"
append+=" mrcache.a64root=$A64_ROOT mrcache.repo=$REPO"
append+=" mrcache.hugepages=${HUGEPAGES:-0}"
[ -n "${MRCACHE_VM_INJECT:-}" ] && append+=" mrcache.inject=$MRCACHE_VM_INJECT"
# -cpu max: FEAT_BTI and FEAT_PAuth (the kernel enables both for user space), so libc's
# BTI-guarded pages and PAC'd returns are exercised for real. pauth-impdef: QEMU's cheap
# implementation-defined PAC algorithm instead of QARMA, which is slow under TCG (the
# checks are the same). The kernel is the uncompressed Image a64-fetch.sh wrote.
args=(-L "$A64_SYSROOT/usr/share/qemu"
  -machine virt -accel tcg,thread=multi -cpu max,pauth-impdef=on -m "${MEM:-2048}" -smp "${SMP:-2}"
  -nodefaults -no-user-config -display none -serial stdio -no-reboot
  -kernel "$A64_SYSROOT/Image" -initrd "$A64_INITRAMFS" -append "$append"
  -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap,id=hostroot"
  -virtfs "local,path=$JOB,mount_tag=job,security_model=none,id=job")

vm_boot "$JOB" "aarch64 " "$QEMU" "$QEMU_LIBS" "${args[@]}"
