# Shared by the VM rig scripts: paths and exit codes. Sourced, not run.
VM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VM_CACHE=${MRCACHE_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mrcache-vm}
SYSROOT=$VM_CACHE/sysroot
TRIXIE_ROOT=$VM_CACHE/trixie-root  # Debian 13 userland for the second-glibc run (trixie-root.sh)
# The guest kernel: MRCACHE_VM_KERNEL=debian12 (default: Debian 12's, with QEMU in SYSROOT,
# fetch.sh) or current (the newest kernel Debian ships, trixie-backports, in KROOT,
# fetch-current.sh). KROOT holds KVER, vmlinux (uncompressed, booted through PVH) and
# lib/modules/KVER; each kernel has its own initramfs.
VM_KERNEL=${MRCACHE_VM_KERNEL:-debian12}
case $VM_KERNEL in
  debian12) KROOT=$SYSROOT; INITRAMFS=$VM_CACHE/initramfs.cpio.gz ;;
  current) KROOT=$VM_CACHE/kernel-current; INITRAMFS=$VM_CACHE/initramfs-current.cpio.gz ;;
  *) echo "mrcache-vm: error: MRCACHE_VM_KERNEL='$VM_KERNEL' is not a kernel the rig knows (allowed: debian12, current)" >&2
     exit 2 ;;
esac
QEMU=$SYSROOT/usr/bin/qemu-system-x86_64
QEMU_LIBS=$SYSROOT/usr/lib/x86_64-linux-gnu:$SYSROOT/lib/x86_64-linux-gnu

# Exit statuses of run.sh, one per failure mode (documented in docs/testing.md). The guest
# side (ci/vm/init, inside the initramfs) exits with the same numbers 90-94.
RC_CMD_FAILED=1      # the VM ran every command; at least one exited non-zero
RC_SETUP=2           # host-side setup failed (download, initramfs, bad arguments)
RC_NO_NETDEV=90      # guest: no network device for rxe
RC_LINK_ADD=91       # guest: `rdma link add rxe0` failed
RC_HOSTROOT=92       # guest: could not mount the host root over 9p
RC_NOT_ACTIVE=93     # guest: rxe0 port never reached ACTIVE
RC_MODULE=94         # guest: a kernel module failed to load
RC_TIMEOUT=124       # host-side timeout: the guest hung
RC_NO_MARKER=125     # QEMU exited without the guest's result line: panic or crash
RC_MISMATCH=126      # the result line and the result file disagree
RC_MISSING=127       # a command has no result file: the guest stopped before it finished

vm_log() { echo "mrcache-vm: $*" >&2; }
vm_die() { local rc=$1; shift; vm_log "error: $*"; exit "$rc"; }
need() { command -v "$1" >/dev/null 2>&1 || vm_die "$RC_SETUP" "required command '$1' not found"; }

# vm_boot JOB LABEL QEMU QEMU_LIBS ARGS...: boot the guest (QEMU with ARGS, its libraries and
# modules from the sysroot QEMU lies in), each console line stamped with the host-side
# seconds since QEMU started and kept in JOB/serial.log; then check the guest's result line
# against JOB/vm.rc and every command of JOB/commands for its result. Exits (the caller's
# last step) with the statuses above: 0 every command passed, RC_CMD_FAILED some failed.
# TIMEOUT (s, default 1800) bounds the whole boot; SMP and MEM only label the first line.
vm_boot() {
  local job=$1 label=$2 qemu=$3 libs=$4; shift 4
  local log=$job/serial.log timeout=${TIMEOUT:-1800} t0=${EPOCHREALTIME/./} qrc e
  vm_log "booting ${label}(TCG, ${SMP:-2} vCPUs, ${MEM:-2048} MiB, limit ${timeout}s), job $job"
  _vm_stamp() {  # prefix each console line with host-side seconds since QEMU started
    local line e
    while IFS= read -r line; do
      e=$(( (${EPOCHREALTIME/./} - t0) / 10000 ))
      printf '[%3d.%02d] %s\n' $((e / 100)) $((e % 100)) "${line%$'\r'}"
    done
  }
  LD_LIBRARY_PATH=$libs QEMU_MODULE_DIR=$(dirname "$qemu")/../lib/x86_64-linux-gnu/qemu \
    timeout --foreground -k 10 "$timeout" "$qemu" "$@" < /dev/null 2>&1 | _vm_stamp | tee "$log" >&2
  qrc=${PIPESTATUS[0]}
  echo "$qrc" > "$job/qemu.rc"
  e=$(( (${EPOCHREALTIME/./} - t0) / 10000 ))
  vm_log "QEMU exited $qrc after $((e / 100)).$(printf %02d $((e % 100))) s"
  # 124: the limit's TERM; 137 at the limit: its KILL. A KILL before the limit is not a hang
  # (the OOM killer's signal): a crash, below.
  if [ "$qrc" = 124 ] || { [ "$qrc" = 137 ] && [ $((e / 100)) -ge "$timeout" ]; }; then
    vm_die "$RC_TIMEOUT" "guest hung: no result within ${timeout}s (log: $log)"
  fi
  local marker
  marker=$(grep -a -o 'MRCACHE-VM-RESULT rc=[0-9]*' "$log" | tail -1 | sed 's/.*rc=//')
  if [ -z "$marker" ]; then
    if vm_kernel_says "$log" 'Kernel panic'; then
      # What crashed and where, on lines of their own: a log's tail may be all a reader sees.
      local lines l
      lines=$(vm_panic_lines "$log")
      while IFS= read -r l; do vm_log "guest console: $l"; done <<< "$lines"
      vm_die "$RC_NO_MARKER" "guest kernel panicked: $(grep -a -m1 'Kernel panic' <<< "$lines") (log: $log)"
    fi
    vm_die "$RC_NO_MARKER" "QEMU exited $qrc without the guest's result line (crash?) (log: $log)"
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
  if [ "$(cat "$job/vm.rc" 2>/dev/null)" != "$marker" ]; then
    vm_die "$RC_MISMATCH" "guest result line says rc=$marker but $job/vm.rc says '$(cat "$job/vm.rc" 2>/dev/null)'"
  fi
  local n=0 failed=0 cmd r
  while IFS= read -r cmd; do
    n=$((n + 1))
    [ -f "$job/results/$n.rc" ] || vm_die "$RC_MISSING" "no result for command $n ($cmd): the guest stopped early"
    r=$(cat "$job/results/$n.rc")
    [ "$r" = 0 ] || { failed=$((failed + 1)); vm_log "command $n failed (exit $r): $cmd"; }
  done < "$job/commands"
  vm_log "$n commands, $failed failed (results in $job/results)"
  case $marker in 0|"$RC_CMD_FAILED") ;; *) vm_die "$marker" "guest runner exited $marker" ;; esac
  [ "$failed" = 0 ] || exit "$RC_CMD_FAILED"
  exit 0
}

# vm_first_without_result JOB: the number of the first command of JOB/commands without an
# exit status in JOB/results/N.rc (one past the last when every command has one).
vm_first_without_result() {
  local n=1
  while [ "$(cat "$1/results/$n.rc" 2> /dev/null)" -ge 0 ] 2> /dev/null; do n=$((n + 1)); done
  echo "$n"
}

# vm_unstamp: a console line without vm_boot's host-side stamp.
vm_unstamp() { sed -E 's/^\[ *[0-9]+\.[0-9]+\] //'; }

# The start of one of the kernel's own console lines in a log: printk's time stamp after
# vm_boot's (never a command's text the runner echoes).
VM_KERNEL_LINE='^\[ *[0-9]+\.[0-9]+\] \[ *[0-9]+\.[0-9]+\] '

# vm_kernel_says LOG REGEX: whether one of the kernel's own console lines in LOG matches REGEX.
vm_kernel_says() { grep -aqE "$VM_KERNEL_LINE.*($2)" "$1"; }

# vm_panic_lines LOG: what crashed and where: at most 4 of the kernel's own lines, unstamped.
vm_panic_lines() {
  grep -a -m4 -E "$VM_KERNEL_LINE.*(Oops|BUG:|RIP: 0010|general protection|Kernel panic)" "$1" | vm_unstamp
}

# vm_initramfs LABEL OUT INIT KVER MODS BUSYBOX APPLETS: the guest's initramfs OUT, rebuilt
# only when its stamp (a hash of INIT, this file and KVER) changed: BUSYBOX with one link per
# applet that the host-runnable busybox APPLETS lists (an arm64 one cannot list its own here:
# the same Debian 12 build; a name it lacks fails loudly at use), the modules rxe, rdma_cm,
# the dummy netdev and 9p over virtio need, from MODS (modules.dep's dependency closure, in
# load order), and INIT as /init. Written through a temporary file of its own, then renamed.
vm_initramfs() {
  local label=$1 out=$2 init=$3 kver=$4 mods=$5 busybox=$6 applets=$7 stamp root tmp w path applet
  stamp=$({ cat "$init" "${BASH_SOURCE[0]}"; echo "$kver"; } | sha256sum | cut -c1-16)
  if [ -f "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$stamp" ]; then
    vm_log "$label: reusing $out"
    return 0
  fi
  root=$(mktemp -d)
  mkdir -p "$root"/{bin,proc,sys,dev,tmp,run,hostroot,lower,scratch,etc,lib/modules/"$kver"}
  cp "$busybox" "$root/bin/busybox"
  for applet in $("$applets" --list); do
    [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
  done
  ln -s bin "$root/sbin"
  local -A seen=()
  _vm_add_module() {
    local m=$1 dep
    [ -n "${seen[$m]:-}" ] && return
    seen[$m]=1
    for dep in $(awk -v m="$m:" '$1 == m { for (i = 2; i <= NF; i++) print $i }' "$mods/modules.dep"); do
      _vm_add_module "$dep"
    done
    mkdir -p "$root/lib/modules/$kver/$(dirname "$m")"
    cp "$mods/$m" "$root/lib/modules/$kver/$m"
    echo "$m" >> "$root/etc/modules"
  }
  : > "$root/etc/modules"
  # A module built into the kernel (modules.builtin) needs no file; crc32_generic (rxe's
  # checksum on 6.1) no longer exists on newer kernels, whose crc32 library is built in.
  local optional
  for w in rdma_rxe ib_uverbs rdma_ucm crc32_generic:optional dummy virtio_pci 9pnet_virtio 9p overlay; do
    optional=; [ "${w%:optional}" != "$w" ] && { w=${w%:optional}; optional=1; }
    path=$(awk -F: -v n="/$w.ko" 'substr($1, length($1) - length(n) + 1) == n { print $1; exit }' "$mods/modules.dep")
    if [ -z "$path" ]; then
      grep -q "/$w\.ko$" "$mods/modules.builtin" 2>/dev/null && continue
      [ -n "$optional" ] && continue
      rm -rf "$root"; vm_die "$RC_SETUP" "$label: module $w not found in kernel $kver"
    fi
    _vm_add_module "$path"
  done
  echo "$kver" > "$root/etc/kver"
  cp "$init" "$root/init"
  chmod +x "$root/init"
  tmp=$(mktemp "$out.XXXXXX")
  ( cd "$root" && find . | "$applets" cpio -o -H newc -R 0:0 2>/dev/null ) | gzip -1 > "$tmp"
  chmod 644 "$tmp"; mv "$tmp" "$out"
  echo "$stamp" > "$out.stamp"
  vm_log "$label: $out ($(du -h "$out" | cut -f1), $(wc -l < "$root/etc/modules") modules)"
  rm -rf "$root"
}
