#!/bin/bash
# Boot the soft-RoCE guest and run commands in it.
#
#   ci/vm/run.sh [-j JOBDIR] [COMMAND...]
#
# Each COMMAND (or each line of JOBDIR/commands) runs in the guest with /bin/sh, in a chroot
# of this host's root filesystem (read-only) with JOBDIR mounted read-write at the same path,
# so host-built binaries run unmodified. Per command, JOBDIR/results/N.rc and N.out come back.
#
# Environment: TIMEOUT (host-side limit in s for the whole job, every boot included, default
# 1800: the whole suite took 450 s of guest time at load 4 here), COMMAND_TIMEOUT (per command,
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
[ -z "$(tail -c1 "$JOB/commands")" ] || echo >> "$JOB/commands"  # a last line without its newline
total=${TIMEOUT:-1800}
case $total in ''|0|*[!0-9]*) vm_die "$RC_SETUP" "TIMEOUT='$total' is not a whole number of seconds above 0" ;; esac
[ -f "$SYSROOT/.complete" ] && [ -f "$KROOT/.complete" ] ||
  vm_die "$RC_SETUP" "VM not prepared for the $VM_KERNEL kernel; run ci/vm/fetch.sh and ci/vm/initramfs.sh"
[ -f "$INITRAMFS" ] || vm_die "$RC_SETUP" "no initramfs for the $VM_KERNEL kernel; run ci/vm/initramfs.sh"
rm -rf "$JOB/results" "$JOB/vm.rc" "$JOB/qemu.rc" "$JOB/rig-error" "$JOB"/serial.stop-*.log
echo "$VM_DIR/guest-run.sh" > "$JOB/runner"
echo "${COMMAND_TIMEOUT:-300}" > "$JOB/command-timeout"

# no_timer_check: on a loaded host TCG can be too slow for the kernel's IO-APIC timer check,
# which then panics at boot ("IO-APIC + timer doesn't work!", seen by ci/demo at load 12).
append="console=ttyS0 panic=-1 oops=panic quiet loglevel=4 no_timer_check mrcache.job=$JOB"
append+=" mrcache.hugepages=${HUGEPAGES:-0}"
[ -n "${MRCACHE_VM_INJECT:-}" ] && append+=" mrcache.inject=$MRCACHE_VM_INJECT"
args=(-L "$SYSROOT/usr/share/qemu" -L "$SYSROOT/usr/share/seabios"
  -machine q35 -accel tcg,thread=multi -cpu max -m "${MEM:-2048}" -smp "${SMP:-2}"
  -nodefaults -no-user-config -display none -vga none -serial stdio -no-reboot
  -kernel "$KROOT/vmlinux" -initrd "$INITRAMFS" -append "$append"
  -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap,id=hostroot"
  -virtfs "local,path=$JOB,mount_tag=job,security_model=none,id=job")

# A guest that stops before its commands are done is booted again, three boots at most
# within TIMEOUT in all, and runs the commands that have no result yet (the guest writes
# results/N.started as command N starts):
# - in a command, where the fault is the emulator's: QEMU killed by a signal, or on the
#   current kernel an "Oops: int3" as the kernel's first oops, ending in "Fatal exception"
#   (under TCG with thread=multi a 7.x kernel's own live patching of its text races the
#   emulation, seen in the first seconds of about one boot in eight): the command runs again,
#   once, its first output kept as N.out.stop-B; the same again is its result, 125;
# - in a command, any other panic: the command's result is 125, with the panic's lines in
#   its output (an earlier command's deferred work may be the cause: the console says more),
#   and the boot is made again for the commands after it;
# - in the boot, before the job's commands (a set-up step of the guest's own, 90-94; a panic
#   or QEMU's death before "rxe0 ACTIVE"): nothing of the job's ran; the boot is made again.
# A panic that is not the emulator's fails the job (exit 125) even when every command passed,
# also between two commands or after the guest's result line. Each stopped boot's console is
# kept as serial.stop-B.log and named; the job's failure is in rig-error.
rig_fail() {  # rig_fail RC MESSAGE: the job's failure, for tests/vm.rs (rig-error) and the log
  echo "$2" > "$JOB/rig-error"
  vm_die "$1" "$2"
}
t_start=$SECONDS
rerun=" "; panicked=; stops=
for boot in 1 2 3; do
  left=$((total - (SECONDS - t_start)))
  [ "$left" -gt 0 ] || rig_fail "$RC_TIMEOUT" "no time left of TIMEOUT=${total}s for boot $boot after:$stops"
  ( TIMEOUT=$left vm_boot "$JOB" "$VM_KERNEL kernel $(cat "$KROOT/KVER") " "$QEMU" "$QEMU_LIBS" "${args[@]}" )
  rc=$?
  next=$(vm_first_without_result "$JOB")
  log=$JOB/serial.log
  where="(log: $JOB/serial.stop-$boot.log)"
  case $rc in
    0|"$RC_CMD_FAILED")
      if vm_kernel_says "$log" 'Kernel panic'; then
        cp "$log" "$JOB/serial.stop-$boot.log"
        panicked="the kernel panicked after the guest's result line $where"
      fi
      [ -z "$panicked" ] || rig_fail "$RC_NO_MARKER" "$panicked"
      exit "$rc" ;;
    "$RC_NO_MARKER")
      first_oops=$(vm_panic_lines "$log" | grep -a -m1 'Oops')
      if [ "$VM_KERNEL" = current ] && [[ $first_oops == *"Oops: int3"* ]] &&
         vm_kernel_says "$log" 'Kernel panic - not syncing: Fatal exception'; then
        what="the kernel's text patching raced the emulation (Oops: int3)"; fault=emulator
      elif vm_kernel_says "$log" 'Kernel panic|Oops'; then
        what="the kernel panicked"; fault=panic
      elif [ "$(cat "$JOB/qemu.rc" 2> /dev/null)" -ge 128 ] 2> /dev/null; then
        what="QEMU died (exit $(cat "$JOB/qemu.rc"))"; fault=emulator
      else
        rig_fail "$rc" "QEMU exited $(cat "$JOB/qemu.rc" 2> /dev/null) without the guest's result line (log: $log)"
      fi ;;
    "$RC_NO_NETDEV"|"$RC_LINK_ADD"|"$RC_HOSTROOT"|"$RC_NOT_ACTIVE"|"$RC_MODULE")
      what="the guest's set-up failed (exit $rc)"; fault=setup ;;
    "$RC_TIMEOUT") rig_fail "$rc" "the guest hung: no result within the ${left}s left of TIMEOUT=${total}s${stops:+, after:$stops}" ;;
    *) rig_fail "$rc" "the VM rig failed (exit $rc; log: $log)" ;;
  esac
  cp "$log" "$JOB/serial.stop-$boot.log"
  if [ -e "$JOB/results/$next.started" ]; then
    if [ "$fault" = emulator ] && [ "${rerun#* $next }" = "$rerun" ]; then
      rerun+="$next "; what="$what in command $next, which runs again"
      mv "$JOB/results/$next.out" "$JOB/results/$next.out.stop-$boot" 2> /dev/null
    else
      { echo; echo "mrcache-vm: $what while this command ran (boot $boot; the cause may be an earlier command's deferred work) $where:"
        vm_panic_lines "$log"; } >> "$JOB/results/$next.out"
      echo 125 > "$JOB/results/$next.rc"
      [ "$fault" = panic ] && panicked="the kernel panicked in command $next $where"
      what="$what in command $next: its result is 125"
    fi
  elif grep -aq 'rxe0 ACTIVE' "$log"; then
    [ "$fault" = panic ] && panicked="the kernel panicked before command $next started $where"
    what="$what before command $next started"
  else
    what="$what in the boot"
  fi
  stops+=" $what $where;"
  next=$(vm_first_without_result "$JOB")
  if [ "$next" -gt "$(wc -l < "$JOB/commands")" ]; then  # every command has its result
    vm_log "$what $where"
    rig_fail "$RC_NO_MARKER" "${panicked:-$what}"
  fi
  [ "$boot" = 3 ] && rig_fail "$rc" "$what; no boot left $where"
  vm_log "$what $where: booting again for the commands from $next on"
  rm -f "$JOB/vm.rc" "$JOB/results/$next.out" "$JOB/results/$next.started"
done
