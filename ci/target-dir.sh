# Sourced by the scripts that use the build: RELEASE, the directory cargo puts the release
# build in. cargo decides where that is (CARGO_TARGET_DIR, build.target-dir in a
# .cargo/config.toml, else target/ in the checkout), so it is asked, never assumed.
RELEASE=$(cargo metadata --format-version 1 --no-deps --offline 2> /dev/null |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/release ||
  RELEASE=
[ "$RELEASE" != /release ] && [ -n "$RELEASE" ] || {
  echo "$(basename "$0"): cannot ask cargo where it builds (cargo metadata failed in $PWD)" >&2
  exit 2
}
# need_built FILE...: each file of the build exists, else one line saying which and why.
need_built() {
  local f
  for f in "$@"; do
    [ -e "$RELEASE/$f" ] || {
      echo "$(basename "$0"): $RELEASE/$f is missing: the release build did not produce it (cargo build --release --workspace)" >&2
      exit 2
    }
  done
}
