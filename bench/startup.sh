#!/bin/sh
# The start-up cost of the preload in a process that never touches verbs: bench/startup.c
# built into target/ and run on /bin/true, PAIRS (default 300) interleaved pairs without and
# with LIB (default target/release/libmrcache.so, built first by cargo build --release
# --workspace). Prints the CPU model, both medians and the median pair difference.
#   bench/startup.sh [PAIRS] [LIB]
set -eu
cd "$(dirname "$0")/.."
pairs=${1:-300}
lib=${2:-$PWD/target/release/libmrcache.so}
[ -f "$lib" ] || { echo "bench/startup.sh: $lib not built (cargo build --release --workspace)" >&2; exit 2; }
mkdir -p target/bench
cc -O2 -Wall -Wextra -Werror -o target/bench/startup bench/startup.c
exec target/bench/startup "$lib" "$pairs" /bin/true
