# Sourced by every command of ci/stacks inside the guest: the settings rxe needs under TCG,
# and the checks. $REPO is the checkout, $RELEASE the release build (ci/target-dir.sh), $JOB
# the job directory (read-write).
. "$REPO/ci/vm/guest-lib.sh"
PRE=$RELEASE/libmrcache.so
MRC=$RELEASE/mrcache
P=$REPO/target/stacks

# libfabric's rxm sizes its verbs completion queue as (rx + tx size) x FI_UNIVERSE_SIZE
# (default 256): above rxe's max_cqe (32767), so fi_enable fails with EINVAL ("Unable to
# create verbs CQ"). Eight peers is plenty on one node.
export FI_UNIVERSE_SIZE=8
# UCX's UD transport (the wireup of rc) drops every packet whose destination GID it does not
# find in the GRH area; on rxe with a RoCE v2 IPv4 GID the check never matches, so wireup
# times out ("UD endpoint ... unhandled timeout"). Turn the check off (or use GID index 0).
export UCX_UD_VERBS_ETH_DGID_CHECK=n
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# begin NAME: a fresh directory for the case; each preloaded process writes its statistics
# there (MRCACHE_STATS=json).
begin() {
  CASE=$1
  # A process that crashes leaves a core for gdb on the host (the guest runs the host's
  # root: same binaries and libraries): $JOB/cores/core.PROGRAM.PID.
  mkdir -p "$JOB/cores"; ulimit -c unlimited
  echo "$JOB/cores/core.%e.%p" > /proc/sys/kernel/core_pattern
  rm -rf "$JOB/cases/$CASE"; mkdir -p "$JOB/cases/$CASE"; cd "$JOB/cases/$CASE" || exit 2
  export MRCACHE_STATS=json MRCACHE_STATS_FILE=$PWD/stats.%p.json
}

# hits MIN [on|off]: the case's preloaded processes together hit the cache at least MIN times
# (0: any number, but statistics must exist, i.e. mrcache was really loaded); `on`: caching
# stayed on in every one of them; `off`: every one turned it off. Prints one summary line
# "STACKS CASE processes=N hits=H misses=M uncached=U off=K" that ci/stacks collects, and why
# caching was off where it was.
hits() {
  python3 - "$CASE" "$1" "${2:-any}" stats.*.json <<'EOF'
import json, sys
case, want, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
files = [f for f in sys.argv[4:] if not f.endswith("*.json")]
reps = [json.loads(l) for f in files for l in open(f) if l.strip()]
h = sum(r["hits"] + r["hits_containing"] for r in reps)
m = sum(r["misses"] for r in reps); u = sum(r["uncached"] for r in reps)
off = [r for r in reps if r.get("caching_off")]
for r in off:
    print(f"  pid {r['pid']}: caching was OFF: {r['caching_off']}")
print(f"STACKS {case} processes={len(reps)} hits={h} misses={m} uncached={u} off={len(off)}")
if not reps:
    sys.exit(f"{case}: no statistics: mrcache was not loaded")
if h < want:
    sys.exit(f"{case}: {h} hits, want at least {want}")
if mode == "on" and off:
    sys.exit(f"{case}: caching was off in {len(off)} of {len(reps)} processes, want on")
if mode == "off" and len(off) != len(reps):
    sys.exit(f"{case}: caching stayed on in {len(reps) - len(off)} of {len(reps)} processes, want it off")
EOF
}

# failclosed: the stack's own memory hooks took unmaps away from mrcache; every process
# noticed and stopped caching (no stale registration possible) and the program still passed.
failclosed() { hits 0 off; }

# stale RC PATTERN: the run (exit status RC, output in ./out) must have failed by detecting
# wrong data (PATTERN in its output): shows that the program's check catches a stale
# registration when mrcache is made blind (MRCACHE_MONITOR=none).
stale() {
  if [ "$1" = 0 ]; then echo "$CASE: passed although mrcache could not see unmaps"; return 1; fi
  grep -q "$2" out || { echo "$CASE: failed (exit $1) without reporting wrong data"; return 1; }
  echo "STACKS $CASE detected stale data (exit $1)"
}

# fi_notified: libfabric's own registration cache was on and its monitor told it of unmaps
# (its "MR cache stats" line at FI_LOG_LEVEL=info, in ./out): libfabric still sees them with
# mrcache in the process.
fi_notified() {
  line=$(grep -a 'MR cache stats: ' out | tail -1)
  n=$(echo "$line" | sed -n 's/.*notify \([0-9]*\).*/\1/p')
  echo "STACKS $CASE libfabric's cache: ${line#*MR cache stats: }"
  [ "${n:-0}" -gt 0 ] || { echo "$CASE: libfabric's cache saw no unmap (notify ${n:-missing})"; return 1; }
}

# failclosed_because PATTERN: failclosed, and every process said why on stderr (in ./out).
failclosed_because() {
  failclosed || return 1
  want=$(ls stats.*.json | wc -l)
  got=$(grep -ac "mrcache\[[0-9]*\]: caching is OFF: .*$1" out)
  [ "$got" = "$want" ] || { echo "$CASE: $got of $want processes said 'caching is OFF: ...$1'"; return 1; }
}

# none: no statistics file, i.e. the case really ran without mrcache.
none() {
  if ls stats.*.json >/dev/null 2>&1; then echo "$CASE: mrcache was loaded in a plain run"; return 1; fi
  echo "STACKS $CASE plain"
}

# fipp ENDPOINT PRELOAD: fi_pingpong server/client pair, small sizes (TCG is slow).
fipp() {
  ep=$1 pre=${2:-}
  prov=verbs; [ "$ep" = rdm ] && prov='verbs;ofi_rxm'
  pair tcp:47592 "timeout 120 env $pre fi_pingpong -p '$prov' -e $ep -S 4096 -I 50" \
    "timeout 120 env $pre fi_pingpong -p '$prov' -e $ep -S 4096 -I 50 10.0.2.15"
}

# uperf TEST SIZE PRELOAD: ucx_perftest server/client pair over rc_verbs.
uperf() {
  t=$1 s=$2 pre=${3:-}
  pair tcp:13337 "timeout 60 env $pre ucx_perftest -t $t -s $s -n 40" \
    "timeout 60 env $pre ucx_perftest 127.0.0.1 -t $t -s $s -n 40"
}
