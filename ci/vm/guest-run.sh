#!/bin/sh
# Runs inside the guest (in the chroot of the host root). Executes every line of
# $JOB/commands in order, each with its own time limit, and leaves results/N.rc and
# results/N.out beside it, and results/N.started as it starts. A command that already has a
# result (from a boot that stopped part-way, ci/vm/run.sh) keeps it and is not run again; N.rc
# is written whole (renamed into place), so a boot stopped while writing it leaves none.
# Exit status: 0 if every command exited 0, else 1.
JOB=$1
LIMIT=$(cat "$JOB/command-timeout" 2>/dev/null || echo 300)
mkdir -p "$JOB/results"
cd "$JOB" || exit 2
export MRCACHE_VM=1 JOB
# mpirun (Open MPI's and MPICH's) refuses the kernel's default host name "(none)": give the
# guest one that resolves to itself (the root is a tmpfs overlay: nothing reaches the host).
if [ "$(hostname)" = "(none)" ]; then
  hostname rxe-guest
  echo "127.0.0.1 rxe-guest" >> /etc/hosts
fi
rc=0; n=0
while IFS= read -r cmd; do
  n=$((n + 1))
  case $(cat "results/$n.rc" 2> /dev/null) in
    0) continue ;;
    ''|*[!0-9]*) ;;
    *) rc=1; continue ;;
  esac
  t0=$(cut -d' ' -f1 /proc/uptime)
  : > "results/$n.started"
  timeout -k 5 "$LIMIT" /bin/sh -c "$cmd" > "results/$n.out" 2>&1 < /dev/null
  r=$?
  echo "$r" > "results/$n.rc.new" && mv "results/$n.rc.new" "results/$n.rc"
  echo "mrcache-vm: command $n exited $r after $(awk -v a="$t0" '{printf "%.1f", $1 - a}' /proc/uptime)s: $cmd"
  [ "$r" = 0 ] || rc=1
done < commands
sync
exit $rc
