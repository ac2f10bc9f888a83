# Shared by the VM rig scripts: paths and exit codes. Sourced, not run.
VM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VM_CACHE=${MRCACHE_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mrcache-vm}
SYSROOT=$VM_CACHE/sysroot
INITRAMFS=$VM_CACHE/initramfs.cpio.gz
TRIXIE_ROOT=$VM_CACHE/trixie-root  # Debian 13 userland for the second-glibc run (trixie-root.sh)
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
