#!/bin/bash
# Boot the soft-RoCE guest and run commands in it.
#
#   ci/vm/run.sh [-j JOBDIR] [COMMAND...]
#
# Each COMMAND (or each line of JOBDIR/commands) runs in the guest with /bin/sh, in a chroot
# of this host's root filesystem (read-only) with JOBDIR mounted read-write at the same path,
# so host-built binaries run unmodified. Per command, JOBDIR/results/N.rc and N.out come back.
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
[ -f "$SYSROOT/.complete" ] || vm_die "$RC_SETUP" "VM not prepared; run ci/vm/fetch.sh and ci/vm/initramfs.sh"
[ -f "$INITRAMFS" ] || vm_die "$RC_SETUP" "no initramfs; run ci/vm/initramfs.sh"
rm -rf "$JOB/results" "$JOB/vm.rc"
echo "$VM_DIR/guest-run.sh" > "$JOB/runner"
echo "${COMMAND_TIMEOUT:-300}" > "$JOB/command-timeout"
LOG=$JOB/serial.log
TIMEOUT=${TIMEOUT:-1800}

# no_timer_check: on a loaded host TCG can be too slow for the kernel's IO-APIC timer check,
# which then panics at boot ("IO-APIC + timer doesn't work!", seen by ci/demo at load 12).
append="console=ttyS0 panic=-1 oops=panic quiet loglevel=4 no_timer_check mrcache.job=$JOB"
append+=" mrcache.hugepages=${HUGEPAGES:-0}"
[ -n "${MRCACHE_VM_INJECT:-}" ] && append+=" mrcache.inject=$MRCACHE_VM_INJECT"
args=(-L "$SYSROOT/usr/share/qemu" -L "$SYSROOT/usr/share/seabios"
  -machine q35 -accel tcg,thread=multi -cpu max -m "${MEM:-2048}" -smp "${SMP:-2}"
  -nodefaults -no-user-config -display none -vga none -serial stdio -no-reboot
  -kernel "$SYSROOT/vmlinux" -initrd "$INITRAMFS" -append "$append"
  -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap,id=hostroot"
  -virtfs "local,path=$JOB,mount_tag=job,security_model=none,id=job")

vm_log "booting (TCG, ${SMP:-2} vCPUs, ${MEM:-2048} MiB, limit ${TIMEOUT}s), job $JOB"
t0=${EPOCHREALTIME/./}
stamp() {  # prefix each console line with host-side seconds since QEMU started
  local line e
  while IFS= read -r line; do
    e=$(( (${EPOCHREALTIME/./} - t0) / 10000 ))
    printf '[%3d.%02d] %s\n' $((e / 100)) $((e % 100)) "${line%$'\r'}"
  done
}
LD_LIBRARY_PATH=$QEMU_LIBS QEMU_MODULE_DIR=$SYSROOT/usr/lib/x86_64-linux-gnu/qemu \
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
