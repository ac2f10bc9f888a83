//! Unit tests of the cache that reach its crate-private parts: the fake provider they share,
//! then one module per behaviour checked.

pub(super) mod fake;

mod class_lists_stay_exact;
mod flip_evicts_its_class_only;
mod key_hash_probe_lengths;
mod recent_hit_word;
mod refusal_word;
mod reused_buried_address;
mod saturated_key_passes_through;
pub(super) mod stale_table_words;
