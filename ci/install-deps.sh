#!/bin/bash
# Install the host packages mrcache's build and tests need (Debian 12). Idempotent: does
# nothing when they are present. The VM's kernel and QEMU are fetched separately
# (ci/vm/fetch.sh) and never installed into the host.
set -euo pipefail
pkgs=(libibverbs-dev librdmacm-dev ibverbs-providers ibverbs-utils perftest rdmacm-utils
      iproute2 gcc g++ libasan8 libtsan2 liblsan0 libubsan1 clang libclang-rt-14-dev make python3 liburing-dev libjemalloc2
      libfabric-bin libfabric-dev ucx-utils libucx-dev openmpi-bin libopenmpi-dev mpich libmpich-dev
      mmdebstrap environment-modules python3-venv xz-utils zstd  # ci/easybuild; the second VM kernel
      file qemu-user-static arch-test)  # the last three for ci/aarch64 (check_out, the arm64 roots)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  [ "$(id -u)" = 0 ] || { echo "install-deps: need root to install ${missing[*]}" >&2; exit 2; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "install-deps: cargo not found (install Rust with rustup)" >&2; exit 2; }
