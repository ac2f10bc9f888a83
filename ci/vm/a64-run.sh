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
LOG=$JOB/serial.log
TIMEOUT=${TIMEOUT:-1800}

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

vm_log "booting aarch64 (TCG, ${SMP:-2} vCPUs, ${MEM:-2048} MiB, limit ${TIMEOUT}s), job $JOB"
t0=${EPOCHREALTIME/./}
stamp() {  # prefix each console line with host-side seconds since QEMU started
  local line e
  while IFS= read -r line; do
    e=$(( (${EPOCHREALTIME/./} - t0) / 10000 ))
    printf '[%3d.%02d] %s\n' $((e / 100)) $((e % 100)) "${line%$'\r'}"
  done
}
LD_LIBRARY_PATH=$QEMU_LIBS QEMU_MODULE_DIR=$A64_SYSROOT/usr/lib/x86_64-linux-gnu/qemu \
  timeout --foreground -k 10 "$TIMEOUT" "$QEMU" "${args[@]}" < /dev/null 2>&1 | stamp | tee "$LOG" >&2
qrc=${PIPESTATUS[0]}
e=$(( (${EPOCHREALTIME/./} - t0) / 10000 ))
vm_log "QEMU exited $qrc after $((e / 100)).$(printf %02d $((e % 100))) s"

if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
  vm_die "$RC_TIMEOUT" "guest hung: no result within ${TIMEOUT}s (log: $LOG)"
fi
marker=$(grep -a -o 'MRCACHE-VM-RESULT rc=[0-9]*' "$LOG" | tail -1 | sed 's/.*rc=//')
if [ -z "$marker" ]; then
  if grep -aq 'Kernel panic' "$LOG"; then
    vm_die "$RC_NO_MARKER" "guest kernel panicked: $(grep -a -m1 'Kernel panic' "$LOG" | cut -c10-) (log: $LOG)"
  fi
  vm_die "$RC_NO_MARKER" "QEMU exited $qrc without the guest's result line (crash?) (log: $LOG)"
fi
case $marker in
  0|"$RC_CMD_FAILED") ;;
  "$RC_NO_NETDEV") vm_die "$marker" "guest: no netdev for rxe" ;;
  "$RC_LINK_ADD") vm_die "$marker" "guest: 'rdma link add rxe0 type rxe' failed" ;;
  "$RC_HOSTROOT") vm_die "$marker" "guest: 9p mount of the host root or the job directory failed" ;;
  "$RC_NOT_ACTIVE") vm_die "$marker" "guest: rxe0 never became ACTIVE" ;;
  "$RC_MODULE") vm_die "$marker" "guest: a kernel module failed to load" ;;
  *) vm_log "guest runner exited $marker" ;;
esac
if [ "$(cat "$JOB/vm.rc" 2>/dev/null)" != "$marker" ]; then
  vm_die "$RC_MISMATCH" "guest result line says rc=$marker but $JOB/vm.rc says '$(cat "$JOB/vm.rc" 2>/dev/null)'"
fi
n=0; failed=0
while IFS= read -r cmd; do
  n=$((n + 1))
  [ -f "$JOB/results/$n.rc" ] || vm_die "$RC_MISSING" "no result for command $n ($cmd): the guest stopped early"
  r=$(cat "$JOB/results/$n.rc")
  [ "$r" = 0 ] || { failed=$((failed + 1)); vm_log "command $n failed (exit $r): $cmd"; }
done < "$JOB/commands"
vm_log "$n commands, $failed failed (results in $JOB/results)"
case $marker in 0|"$RC_CMD_FAILED") ;; *) vm_die "$marker" "guest runner exited $marker" ;; esac
[ "$failed" = 0 ] || exit "$RC_CMD_FAILED"
exit 0
