//! The lock-free path: an exact hit on the provider's own pointer and its release, each a
//! probe of a table and one compare-and-swap on the entry's state word; it steps aside (to
//! the locked path in `mod.rs`) whenever an invalidation began since the last drain.

use super::*;

/// In `Cache::refuse`: every request (caching stopped, or the registrar verifies each
/// hit). Not an access flag (`access::classify` refuses it), so `try_hit` sets it in the
/// request's flags to test both at once.
pub(super) const REFUSE_ALL: u32 = 1 << 31;

/// The flags `try_hit` refuses: remote access unless remote keys are kept, and everything
/// when the registrar verifies each hit (which the lock-free path cannot do).
pub(super) fn refusal(remote: RemoteMode, verifies: bool) -> u32 {
    let remote = if remote == RemoteMode::Keep {
        0
    } else {
        access::REMOTE
    };
    remote | if verifies { REFUSE_ALL } else { 0 }
}

impl<R: Registrar> Cache<R> {
    /// Whether no invalidation began since the last complete drain (the hit path may skip
    /// the lock). An unmap hook counts itself begun before the memory changes, so a lookup
    /// that starts after that sees it here.
    #[inline]
    pub(super) fn clean(&self) -> bool {
        self.queue.started() == self.clean.load(SeqCst)
    }

    /// The fast attempt at an exact hit, for a caller that cannot afford more (the preload
    /// shell calls it before its re-entrancy guard and panic shield). It does what
    /// `acquire` does before taking its lock: caching on, remote keys kept, verification
    /// off; then an exact hit on the provider's own pointer, counted. Promises: never
    /// takes the cache lock, never allocates, never calls the registrar, never panics.
    /// `None`: nothing was changed; take `acquire`.
    ///
    /// No `classify`: an exact hit is on an entry whose key is the request's own (address,
    /// length, access, PD, iova), and every entry was inserted by `acquire` after its
    /// request passed `classify`, which reads nothing but those fields; a request it
    /// refuses (bad range, unknown or on-demand flags) so matches no entry. The request's
    /// `context` is not read either (not part of the key).
    #[inline(always)]
    pub fn try_hit(&self, req: &Request) -> Option<usize> {
        // One word for caching stopped, remote keys not kept, and verification on.
        if (req.access | REFUSE_ALL) & self.refuse.load(Acquire) != 0 {
            return None;
        }
        self.hit_unlocked(req)
    }

    /// The fast attempt at `release`: give back one holding of a live entry's provider
    /// pointer. Promises as `try_hit`: no cache lock, no allocation, no registrar call, no
    /// panic. `Some(Released::Kept)`: released. `None`: nothing was changed; take
    /// `release` (not ours, a handle of another kind, a second release, the last
    /// reference of an invalidated entry, or invalidations to drain first).
    #[inline]
    pub fn try_release(&self, ptr: usize) -> Option<Released> {
        if !self.clean() {
            return None;
        }
        // The slot a hit on this thread just handed `ptr` out of, if the recent-hit word
        // still names it: validated as a table word is (docs/design/cache.md, "Concurrency").
        if let Some(slot) = self
            .fast
            .recent
            .candidate(ptr)
            .and_then(|id| self.fast.slots.get(id))
            && slot.release_if_mr(ptr)
        {
            return Some(Released::Kept);
        }
        self.release_by_table(ptr)
    }

    /// `try_release` through the MR-pointer table: apart, so that the release through the
    /// recent-hit word saves and restores no registers.
    #[inline(never)]
    fn release_by_table(&self, ptr: usize) -> Option<Released> {
        self.fast.mr_candidates(ptr, |_, slot| {
            slot.release_if_mr(ptr).then_some(Released::Kept)
        })
    }

    /// An exact hit on the provider's own pointer without the cache lock, when no
    /// invalidation began since the last drain; None: take the locked path.
    #[inline(always)]
    pub(super) fn hit_unlocked(&self, req: &Request) -> Option<usize> {
        if !self.clean() {
            return None;
        }
        let share = !self.limits.shadow;
        let hash = key_hash(req);
        self.fast.exact_candidates(
            hash,
            #[inline(always)]
            |id, slot| {
                // Another key's entry (a tag collision, or a slot reused since the word was
                // read) is passed over untouched: a claim on it, however brief, would set its
                // clock bit and refuse a concurrent hit on it the provider's pointer.
                let seen = slot.look(req)?;
                #[cfg(test)]
                super::stale_words::before_claim(id);
                // Only from a word of the generation `look` saw: the entry whose key matched
                // (a reuse in between changed the generation for good; `slots`).
                let flushed = slot.claim_seen(seen, share)?;
                // Striped by slot: the hash is dead by here, one register fewer in the loop.
                if flushed != 0 {
                    self.hits.add(id as usize, flushed);
                }
                let mr = slot.mr_ptr();
                self.fast.recent.remember(mr, id);
                Some(mr)
            },
        )
    }
}
