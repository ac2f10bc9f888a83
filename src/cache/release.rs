//! The app's `ibv_dereg_mr` on the locked path: an entry's last release (kept idle,
//! deregistered if its memory went away, or evicted over the limits), a pass-through's own
//! MR, a double deregistration caught by a tombstone.

use super::*;

impl<R: Registrar> Cache<R> {
    /// The app's `ibv_dereg_mr(ptr)`.
    pub fn release(&self, ptr: usize) -> Released {
        self.release_at(ptr, self.sampled().then(Instant::now))
    }

    /// `release`, for a hook entered at `t_start`: a remote release's admission figure is
    /// timed from there (what the app's `ibv_dereg_mr` costs, not only the cache's part).
    /// `None`: not a sampled call (`admission::sampled`), no figure.
    pub fn release_at(&self, ptr: usize, t_start: Option<Instant>) -> Released {
        self.drain_pending();
        // The provider's own pointer, not the last reference of a dead entry: no lock.
        if let Some(released) = self.try_release(ptr) {
            return released;
        }
        let mut st = self.lock();
        let Some(handle) = st.handles.remove(&ptr) else {
            return match st.release_primary(&self.fast, ptr) {
                Ok(None) => Released::Kept,
                Ok(Some(mr)) => {
                    drop(st);
                    // Invalidated while in use, now released: gone.
                    self.deregister_all(&[mr]);
                    Released::Deregistered
                }
                Err(()) => {
                    let double = st.released(&self.fast, ptr) || self.fast.by_mr(ptr).is_some();
                    if double {
                        self.stats.add(Counter::DoubleDeregs, 1);
                        Released::DoubleRelease
                    } else {
                        Released::NotOurs
                    }
                }
            };
        };
        let to_dereg = match handle {
            Handle::Uncached { mr, len, .. } => {
                // Tombstoned before the provider can free it (and so reuse the address): a
                // second ibv_dereg_mr of it is then a double release, never handed to
                // libibverbs with freed memory.
                self.fast.foreign.bury(ptr);
                drop(st);
                let t = Instant::now();
                return match self.registrar.deregister(mr) {
                    Ok(()) => {
                        if len > 0 {
                            let ns = t.elapsed().as_nanos() as f64;
                            self.figures(Access::Local, len, |f| f.dereg.add(ns));
                        }
                        Released::Deregistered
                    }
                    Err(e) => {
                        let mut st = self.lock();
                        self.fast.foreign.forget(ptr);
                        st.handles
                            .insert(ptr, Handle::Uncached { mr, len, addr: 0 });
                        Released::Failed(e)
                    }
                };
            }
            Handle::Alias { mr, grant } => {
                // Marked released first: a second ibv_dereg_mr of it is a double release.
                st.released_grants.insert(ptr);
                drop(st);
                if let Err(e) = self.registrar.deregister(mr) {
                    let mut st = self.lock();
                    st.released_grants.remove(&ptr);
                    st.handles.insert(ptr, Handle::Alias { mr, grant });
                    return Released::Failed(e);
                }
                if grant {
                    self.registrar.recycle_grant(ptr);
                } else {
                    let mut st = self.lock();
                    st.released_grants.remove(&ptr);
                    st.spare_shadows.insert(ptr);
                }
                return Released::Deregistered;
            }
            Handle::Shadow { id, .. } => {
                st.spare_shadows.insert(ptr);
                st.unref(&self.fast, id)
            }
            Handle::Granted { id, access } => {
                // The key must be dead before ibv_dereg_mr returns; without the lock. Marked
                // released first, so a racing second ibv_dereg_mr of it is a double release,
                // never passed to libibverbs.
                st.released_grants.insert(ptr);
                // The entry lives on while this handle's reference does: its length is fixed.
                let len = st.entry(&self.fast, id).map_or(0, |e| e.req.len);
                drop(st);
                // Not a sampled call, but the class's round needs figures (a trial's
                // release, the first few): timed from here (the unbind and its completion).
                let t_start = t_start.or_else(|| {
                    (len > 0 && self.needs_round_sample(Access::Remote, len)).then(Instant::now)
                });
                if let Err(e) = self.registrar.revoke(ptr) {
                    let mut st = self.lock();
                    st.released_grants.remove(&ptr);
                    st.handles.insert(ptr, Handle::Granted { id, access });
                    return Released::Failed(e);
                }
                self.stats.add(Counter::RemoteRevokes, 1);
                let gone = self.lock().unref(&self.fast, id);
                if len > 0
                    && let Some(t) = t_start
                {
                    let ns = t.elapsed().as_nanos() as f64;
                    self.figures(Access::Remote, len, |f| f.add_release(ns));
                }
                return self.released_last(gone);
            }
        };
        drop(st);
        self.released_last(to_dereg)
    }

    /// A release's end: `gone`, the entry's MR when that was the last reference of an
    /// entry invalidated while in use, is deregistered.
    fn released_last(&self, gone: Option<Mr>) -> Released {
        match gone {
            None => Released::Kept,
            Some(mr) => {
                // Invalidated while in use, now released: gone. A failure is counted (the
                // app released it; nothing can hand it out again).
                self.deregister_all(&[mr]);
                Released::Deregistered
            }
        }
    }
}
