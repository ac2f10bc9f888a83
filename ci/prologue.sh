# The shared start of ci/bench, ci/coverage, ci/demo and ci/stress, sourced from the
# repository root: install what is missing, prepare the VM, build, and make a fresh job
# directory target/<script name>. C programs are built with CC_FLAGS, the flags tests/vm.rs
# builds the VM suite's programs with.
bash ci/install-deps.sh
bash ci/vm/fetch.sh
bash ci/vm/initramfs.sh
cargo build --release --workspace -q
. ci/target-dir.sh
need_built libmrcache.so mrcache
job=$PWD/target/$(basename "$0")
rm -rf "$job"; mkdir -p "$job"
lib=$RELEASE/libmrcache.so
CC_FLAGS=(-O2 -g -D_GNU_SOURCE -Wall -Wextra -Werror -pthread -I tests/c/guest)
