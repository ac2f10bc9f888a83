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
[ -f "$SYSROOT/.complete" ] && [ -f "$KROOT/.complete" ] ||
  vm_die "$RC_SETUP" "VM not prepared for the $VM_KERNEL kernel; run ci/vm/fetch.sh and ci/vm/initramfs.sh"
[ -f "$INITRAMFS" ] || vm_die "$RC_SETUP" "no initramfs for the $VM_KERNEL kernel; run ci/vm/initramfs.sh"
rm -rf "$JOB/results" "$JOB/vm.rc" "$JOB/qemu.rc"
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

# A guest that fails before its commands are done is booted again, twice at most, and runs
# the commands that have no result yet. A kernel panic: under TCG with thread=multi a newer
# kernel's own live patching of its text (static keys, alternatives) can race the emulation
# ("Oops: int3", seen in the first seconds of about one boot in eight of a 7.x kernel). QEMU
# killed by a signal: the emulator's fault. The command that was running then runs again; if
# the same happens in the same command again, that is its result. A set-up step of the
# guest's own (90-94) that failed: no command ran, and nothing of the job's is at fault. Each
# failed boot's console is kept (serial.panic-N.log, serial.crash-N.log, serial.setup-N.log)
# and named on a line of its own.
again=
for boot in 1 2 3; do
  ( vm_boot "$JOB" "$VM_KERNEL kernel $(cat "$KROOT/KVER") " "$QEMU" "$QEMU_LIBS" "${args[@]}" )
  rc=$?
  next=$(vm_first_without_result "$JOB")
  case $rc in
    "$RC_NO_MARKER")
      if grep -aqE 'Kernel panic|Oops' "$JOB/serial.log"; then what=panic
      elif [ "$(cat "$JOB/qemu.rc" 2> /dev/null)" -ge 128 ] 2> /dev/null; then what=crash
      else exit "$rc"; fi ;;
    "$RC_NO_NETDEV"|"$RC_LINK_ADD"|"$RC_HOSTROOT"|"$RC_NOT_ACTIVE"|"$RC_MODULE")
      [ "$next" = 1 ] || exit "$rc"; what=setup ;;
    *) exit "$rc" ;;
  esac
  [ "$boot" = 3 ] && exit "$rc"
  case $what in
    panic) where="the kernel panicked" ;;
    crash) where="QEMU died (exit $(cat "$JOB/qemu.rc"))" ;;
    setup) where="the guest's set-up failed (exit $rc)" ;;
  esac
  if [ "$what" != setup ] && [ "$next" != 1 ] && [ "$next" = "$again" ]; then
    vm_log "$where in command $next again: that is its result"
    exit "$rc"
  fi
  cp "$JOB/serial.log" "$JOB/serial.$what-$boot.log"
  if [ "$what" = setup ]; then :
  elif [ "$next" = 1 ]; then where+=" before the first command"
  else where+=" in command $next"; again=$next
  fi
  vm_log "$where (log: $JOB/serial.$what-$boot.log): booting again to run the commands from $next on"
  rm -f "$JOB/vm.rc" "$JOB/results/$next.out"
done
