//! The preload (libmrcache.so) on the host, without RDMA: C programs under `tests/c/host/`
//! with fake providers behind the library, each module one behaviour. Every test makes its
//! files under a directory of its own in `CARGO_TARGET_TMPDIR` (tests run in parallel).

mod common;

mod admission;
mod bench_first_pair_outside_loop;
mod caching_off;
mod cancel_pending_after_registration;
mod coexist_with_other_hooks;
mod device_memory_not_cached;
mod dlsym;
mod drain_thread_start;
mod early_and_refused_hooks;
mod engine_attach;
mod fast_path;
mod fork_during_patch;
mod fork_in_malloc;
mod fork_with_atfork_handlers;
mod inertness;
mod interposer_chains;
mod memlock_budget;
mod mprotect_drops_entries;
mod nested_dereg;
mod next_definition;
mod no_hit_after_jump_changed;
mod no_registration_costs_nothing;
mod on_demand;
mod passthrough_enomem_retry;
mod passthrough_reads_no_clock;
mod patch_under_threads;
mod programs_without_verbs;
mod remap_file_pages;
mod rereg;
mod rereg_and_fork_edges;
mod revoke_window_failures;
mod sanitizer_builds;
mod unannounced_overwrite;
mod underscore_fork_child_keeps_state;
mod uprobe_on_patched_entry;
