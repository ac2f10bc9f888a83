# Helpers for test cases running in the guest (sourced by the generated case scripts).

# wait_ready SPEC: block until a server is ready. SPEC is tcp:PORT (a TCP socket listening,
# as the pingpongs and perftest use for their rendezvous) or cm:PORT (an rdma_cm listener,
# as rping and the rsocket tools use). Gives up after 30 s.
wait_ready() {
  spec=$1; port=${spec#*:}; i=0
  while [ $i -lt 300 ]; do
    case $spec in
      tcp:*) hex=$(printf '%04X' "$port")
             grep -q ":$hex 0\{8,32\}:0000 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0 ;;
      cm:*)  rdma res show cm_id 2>/dev/null | grep -q "state LISTEN.*:$port " && return 0 ;;
      *)     echo "wait_ready: unknown readiness '$spec' (use tcp:PORT or cm:PORT)"; return 2 ;;
    esac
    sleep 0.1; i=$((i + 1))
  done
  echo "wait_ready: server never became ready ($spec)"
  return 1
}

# pair READY SERVER CLIENT: start SERVER, wait for READY, run CLIENT; both must exit 0.
# Each side's output is shown with a prefix so a failure can be read.
pair() {
  ready=$1 server=$2 client=$3
  sh -c "$server" > server.out 2>&1 &
  spid=$!
  if ! wait_ready "$ready"; then kill $spid 2>/dev/null; wait $spid; sed 's/^/server| /' server.out; return 1; fi
  sh -c "$client" > client.out 2>&1; crc=$?
  wait $spid; src=$?
  sed 's/^/client| /' client.out
  sed 's/^/server| /' server.out
  echo "pair: client exit $crc, server exit $src"
  [ "$crc" = 0 ] && [ "$src" = 0 ]
}

# in_trixie COMMAND [ARG...]: run COMMAND in the Debian 13 root ($TRIXIE_ROOT: glibc 2.41,
# trixie's libibverbs and providers; ci/vm/trixie-root.sh builds it) instead of the host's,
# in the current directory. /proc, /sys, /dev, /tmp, the test programs ($BIN), the directory
# of libmrcache.so and the job directory are bound in at their own paths, so the host-built
# programs and the preload run unmodified against that userland. The environment (LD_PRELOAD,
# MRCACHE_*) goes with it.
in_trixie() {
  [ -f "$TRIXIE_ROOT/.complete" ] ||
    { echo "in_trixie: no finished root at '$TRIXIE_ROOT' (run ci/vm/trixie-root.sh)"; return 2; }
  for d in /proc /sys /dev /tmp "$BIN" "$(dirname "$MRCACHE_PRELOAD")" "$JOB"; do
    mountpoint -q "$TRIXIE_ROOT$d" && continue
    mkdir -p "$TRIXIE_ROOT$d" && mount --rbind "$d" "$TRIXIE_ROOT$d" ||
      { echo "in_trixie: cannot bind $d into $TRIXIE_ROOT"; return 2; }
  done
  chroot "$TRIXIE_ROOT" /bin/sh -c 'cd "$0" && exec "$@"' "$PWD" "$@"
}
