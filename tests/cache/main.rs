//! The cache in process, without the preload: fake providers, the model, races, the
//! lock-free hit, admission and the remote-key policy. One module per behaviour.

mod admission;
mod cache_model;
mod cache_races;
mod lock_free_hit_after_unmap;
mod lock_free_hit_under_churn;
mod recent_hit_races;
mod remote_policy;
mod stop_caching;
mod uncacheable_asked_on_miss_only;
