#!/bin/sh
# In a guest (POSIX sh): ROUNDS rounds of bench/regmr, one process per mode, the order of the
# modes rotated by the round, and each round's speed-up of every mode over that round's
# plain run, then the medians. Finer-grained than ci/bench's grid (3 rounds), for a guest
# whose speed changes by 2x from one second to the next (the aarch64 guest under TCG).
#   bench/alternate.sh REGMR LIB SIZE [ROUNDS] [SECONDS]
# Modes: plain (libibverbs alone), enable0 (the library preloaded, MRCACHE_ENABLE=0: every
# call passed through), bypass (MRCACHE_REMOTE=bypass), default. Remote access. The
# default's statistics go to $STATS_DIR/alternate-ROUND-SIZE.json when STATS_DIR is set.
# LIB_B=another build of the library adds the modes defaultB and bypassB (the default and
# bypass of that build), to compare two builds in one boot; MODES="plain default ..." picks
# and orders the modes.
# Example, the aarch64 guest (after ci/aarch64 build; the build dir is bound in the guest):
#   ci/vm/a64-cc -O2 -o target/a64x/regmr bench/regmr.c -libverbs
#   ci/vm/a64-run.sh -j target/a64x "sh $PWD/bench/alternate.sh $PWD/target/a64x/regmr \
#     $PWD/target/aarch64-cross/aarch64-unknown-linux-gnu/release/libmrcache.so 4k 8"
set -u
regmr=$1 lib=$2 size=$3 rounds=${4:-8} secs=${5:-1}
run() {
  case $1 in
    plain) "$regmr" "$secs" remote "$size" ;;
    enable0) MRCACHE_ENABLE=0 LD_PRELOAD=$lib "$regmr" "$secs" remote "$size" ;;
    bypass) MRCACHE_REMOTE=bypass LD_PRELOAD=$lib "$regmr" "$secs" remote "$size" ;;
    defaultB) LD_PRELOAD=$LIB_B "$regmr" "$secs" remote "$size" ;;
    bypassB) MRCACHE_REMOTE=bypass LD_PRELOAD=$LIB_B "$regmr" "$secs" remote "$size" ;;
    default)
      if [ -n "${STATS_DIR:-}" ]; then
        MRCACHE_STATS=json MRCACHE_STATS_FILE="$STATS_DIR/alternate-$r-$size.json" \
          LD_PRELOAD=$lib "$regmr" "$secs" remote "$size"
      else
        LD_PRELOAD=$lib "$regmr" "$secs" remote "$size"
      fi ;;
  esac 2> /dev/null | sed -n 's/.*ns_per_pair=\([0-9]*\).*/\1/p'
}
out=$(mktemp)
modes=${MODES:-plain enable0 bypass default${LIB_B:+ defaultB bypassB}}
# shellcheck disable=SC2086
set -- $modes
r=1
while [ "$r" -le "$rounds" ]; do
  for m in "$@"; do echo "$r $m $(run "$m")"; done
  first=$1; shift; set -- "$@" "$first"
  r=$((r + 1))
done | tee "$out"
awk -v size="$size" -v modes="$modes" '$3 != "" {ns[$1, $2] = $3; rounds[$1] = 1}
  END {
    m = 0
    k = split(modes, all, " ")
    for (i = 1; i <= k; i++) if (all[i] != "plain") modes_[++m] = all[i]
    for (i = 1; i <= m; i++) {
      mode = modes_[i]
      n = 0
      for (r in rounds) if (ns[r, "plain"] && ns[r, mode]) v[++n] = ns[r, "plain"] / ns[r, mode]
      for (a = 1; a <= n; a++) for (b = a + 1; b <= n; b++) if (v[b] < v[a]) { t = v[a]; v[a] = v[b]; v[b] = t }
      line = ""; lg = 0; for (a = 1; a <= n; a++) { line = line sprintf(" %.2f", v[a]); lg += log(v[a]) }
      med = n == 0 ? 0 : (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2)
      printf "%s %-8s median speed-up %.2fx (geometric mean %.2fx) over %d rounds; sorted:%s\n", size, mode, med, n == 0 ? 0 : exp(lg / n), n, line
    }
  }' "$out"
rm -f "$out"
