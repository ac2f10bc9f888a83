#!/bin/sh
# One round of ci/bench's speed-up runs, in the guest (POSIX sh; ci/bench puts each round
# in its own VM command). Every line a run prints is prefixed "R<round> <mode> <label>";
# each preloaded run writes its statistics (MRCACHE_STATS=json) to
# $JOB/stats/<group>-<label>-<mode>-<round>.json, which ci/bench-report.py reads.
#   ci/bench-guest.sh grid|patterns ROUND SECONDS BIN LIB
# grid      bench/regmr: reg+dereg of one buffer, 4 KiB to 64 MiB, local and remote access,
#           one process per size; modes plain (libibverbs alone), default (the preload as
#           shipped: MRCACHE_REMOTE=revoke), and for remote access keep and bypass
#           (MRCACHE_REMOTE=keep|bypass).
# patterns  bench/evict: working sets larger than the cache (cyclic 1.5x, 2x, 4x through a
#           32-entry cache, a Zipf-like mix, 2x the cache by bytes), a set that fits, and
#           the cyclic 2x with remote access under each MRCACHE_REMOTE mode.
# The order of the modes rotates with the round, so no mode always runs first.
set -u
group=$1 round=$2 secs=$3 bin=$4 lib=$5
mkdir -p "$JOB/stats"
modes() { # the mode list rotated by the round
  set -- "$@"
  i=1
  while [ "$i" -lt "$round" ]; do first=$1; shift; set -- "$@" "$first"; i=$((i + 1)); done
  echo "$@"
}
# run LABEL MODE ENV... -- PROGRAM ARGS...
run() {
  label=$1 mode=$2; shift 2
  envs=""
  while [ "$1" != -- ]; do envs="$envs $1"; shift; done
  shift
  case $mode in
    plain) env $envs "$@" ;;
    default) env $envs LD_PRELOAD="$lib" MRCACHE_STATS=json \
               MRCACHE_STATS_FILE="$JOB/stats/$group-$label-$mode-$round.json" "$@" ;;
    *) env $envs MRCACHE_REMOTE="$mode" LD_PRELOAD="$lib" MRCACHE_STATS=json \
         MRCACHE_STATS_FILE="$JOB/stats/$group-$label-$mode-$round.json" "$@" ;;
  esac 2>&1 | sed "s/^/R$round $mode $label /"
}
case $group in
  grid)
    # MRCACHE_REMOTE governs remote access only: local-only registrations run plain and
    # default (keep and bypass would run the same code).
    for size in 4k 64k 256k 1m 4m 16m 64m; do
      for mode in $(modes plain default); do
        run "local:$size" "$mode" -- "$bin/regmr" "$secs" local "$size"
      done
    done
    for size in 4k 64k 256k 1m 4m 16m 64m; do
      for mode in $(modes plain default keep bypass); do
        run "remote:$size" "$mode" -- "$bin/regmr" "$secs" remote "$size"
      done
    done ;;
  patterns)
    # label  env for the preloaded runs  evict arguments (N SECONDS PATTERN SIZE ACCESS)
    while read -r label env n pattern size access modes_here; do
      for mode in $(modes $modes_here); do
        e=$env; [ "$mode" = plain ] && e=
        run "$label" "$mode" $e -- "$bin/evict" "$n" "$secs" "$pattern" "$size" "$access"
      done
    done <<LIST
cyclic-1.5x MRCACHE_MAX_ENTRIES=32 48 cyclic 65536 local plain default
cyclic-2x MRCACHE_MAX_ENTRIES=32 64 cyclic 65536 local plain default
cyclic-4x MRCACHE_MAX_ENTRIES=32 128 cyclic 65536 local plain default
zipf MRCACHE_MAX_ENTRIES=32 256 zipf 65536 local plain default
bytes-2x MRCACHE_MAX_BYTES=4M 8 cyclic 1048576 local plain default
fits MRCACHE_MAX_ENTRIES=128 64 cyclic 65536 local plain default
remote-cyclic-2x MRCACHE_MAX_ENTRIES=32 64 cyclic 65536 remote plain default keep bypass
LIST
    ;;
  *) echo "bench-guest: group '$group': use grid or patterns" >&2; exit 2 ;;
esac
