//! Unit tests of `patch`: on x86_64 our own code pages patched and other patchers' jumps
//! decoded, then entries patched after their first instruction; on aarch64 (under qemu-user,
//! `ci/aarch64 unit`) a patched stub under running threads.

mod aarch64_stub_words;
#[cfg(target_arch = "aarch64")]
mod aarch64_threads;
#[cfg(target_arch = "x86_64")]
mod kept_instruction;
#[cfg(target_arch = "x86_64")]
mod own_and_foreign_jumps;
