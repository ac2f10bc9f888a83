//! What the cache lock guards, and the lookup structures the hit path shares with it.
//!
//! `Fast` (the slots, which hold each entry's request, MR and state word, and the tables of
//! the exact key and of the MR pointer) is read by the hit path without the cache lock;
//! entries enter and leave it only under the lock. `State` holds the rest: the range index
//! (containing-range lookups and invalidation), the handles that are not the provider's own
//! pointer, and the bookkeeping of what was deregistered.

use super::hash::{WordMap, WordSet, hash_of, words_hash};
use super::recent::RecentHits;
use super::slots::{self, Slot, Slots};
use super::table::Table;
use super::types::{Limits, Mr, Request};
use crate::access;
use crate::index::RangeIndex;
use std::collections::VecDeque;

mod room;

/// How many drained invalidations are remembered for the registration race check.
const RECENT: usize = 1024;

/// The hash of a request's exact key: three words, three multiplies. The flags go above
/// any length a process can map (2^48), and the PD (a heap pointer, the same for most
/// keys) shares a word with the iova (most often the address, rotated so it does not
/// cancel the first word's); keys that differ only there share a probe run, which the
/// slot's full compare sorts out.
#[inline]
pub(crate) fn key_hash(r: &Request) -> u64 {
    words_hash([
        r.addr as u64,
        r.len as u64 ^ ((r.access as u64) << 48),
        r.pd as u64 ^ r.iova.rotate_left(23),
    ])
}

/// The hash of a provider MR pointer.
#[inline]
pub(crate) fn mr_hash(ptr: usize) -> u64 {
    hash_of(&ptr)
}

/// What the hit path reads without the cache lock; entries enter and leave the tables
/// under the lock only.
#[derive(Default)]
pub(crate) struct Fast {
    pub(crate) slots: Slots,
    /// Every indexed entry by its exact request: the hit path's lookup.
    pub(super) exact: Table,
    /// Every present entry by its provider MR pointer: the release path's lookup.
    pub(super) by_mr: Table,
    /// The slots of recent lock-free hits by thread and MR pointer: where the release
    /// looks before `by_mr`.
    pub(super) recent: RecentHits,
    /// The MR addresses that are not the cache's: pass-throughs and tombstones.
    pub(super) foreign: super::foreign::Foreign,
}

impl Fast {
    /// Lock-free: call `f` on each slot that may hold `req`'s key (unvalidated).
    #[inline(always)]
    pub(crate) fn exact_candidates<R>(
        &self,
        hash: u64,
        mut f: impl FnMut(u32, &Slot) -> Option<R>,
    ) -> Option<R> {
        self.exact.find(
            hash,
            #[inline(always)]
            |id| f(id, self.slots.get(id)?),
        )
    }

    /// Lock-free: call `f` on each slot that may hold MR pointer `ptr` (unvalidated).
    #[inline(always)]
    pub(crate) fn mr_candidates<R>(
        &self,
        ptr: usize,
        mut f: impl FnMut(u32, &Slot) -> Option<R>,
    ) -> Option<R> {
        self.by_mr
            .find(mr_hash(ptr), |id| f(id, self.slots.get(id)?))
    }

    /// The indexed entry of exactly `req` (exact under the cache lock).
    pub(crate) fn exact(&self, req: &Request) -> Option<u32> {
        self.exact_candidates(key_hash(req), |id, s| {
            (s.present() && s.indexed() && s.has_key(req)).then_some(id)
        })
    }

    /// The present entry of MR pointer `ptr` (exact under the cache lock).
    pub(crate) fn by_mr(&self, ptr: usize) -> Option<u32> {
        self.mr_candidates(ptr, |id, s| {
            (s.present() && s.mr_ptr() == ptr).then_some(id)
        })
    }

    pub(super) fn slot_key_hash(&self, id: u32) -> u64 {
        self.slots.get(id).map_or(0, |s| key_hash(&s.request()))
    }

    pub(super) fn slot_mr_hash(&self, id: u32) -> u64 {
        self.slots.get(id).map_or(0, |s| mr_hash(s.mr_ptr()))
    }

    /// Bytes of the slots, both tables and the recent hits.
    pub fn bytes(&self) -> usize {
        self.slots.bytes()
            + self.exact.bytes()
            + self.by_mr.bytes()
            + self.recent.bytes()
            + self.foreign.bytes()
    }
}

/// An entry's request and MR, as its slot holds them.
#[derive(Clone, Copy)]
pub(crate) struct Entry {
    pub(crate) req: Request,
    pub mr: Mr,
}

pub(crate) enum Handle {
    /// `access`: the rights its own registration asked for (the entry's may be wider).
    Shadow { id: u32, access: u32 },
    /// A handle with its own remote key (`Registrar::grant`), revoked at release.
    Granted { id: u32, access: u32 },
    Uncached {
        mr: Mr,
        /// The registration's length (0: not known, after `ibv_rereg_mr`), for the
        /// admission figures.
        len: usize,
        /// The registration's start (0 with `len` 0), for `fork_ranges`.
        addr: usize,
    },
    /// A shadow or granted handle whose entry left the cache for the app's `ibv_rereg_mr`:
    /// a copy of `mr`, now the app's own registration. Its dereg deregisters
    /// `mr` and returns the handle's memory to the pool it came from (`grant`: the
    /// registrar's spare grants, else the spare shadows).
    Alias { mr: Mr, grant: bool },
}

impl Handle {
    /// The app's own registration of `req`, made through the provider for it alone.
    pub(crate) fn uncached(mr: Mr, req: &Request) -> Handle {
        Handle::Uncached {
            mr,
            len: req.len,
            addr: req.addr,
        }
    }
}

pub(crate) enum Claim {
    Ready(usize),
    NeedShadow { id: u32, mr: Mr },
    NeedGrant { id: u32, mr: Mr },
}

#[derive(Default)]
pub(crate) struct State {
    /// Slot ids ever used: every entry's id is below.
    next_id: u32,
    free_ids: Vec<u32>,
    pub(crate) index: RangeIndex,
    /// Handles other than the provider's own pointer (those are counted in the slots).
    pub(crate) handles: WordMap<usize, Handle>,
    pub(crate) spare_shadows: WordSet<usize>,
    /// Spare shadows a hit took out of `spare_shadows` and is filling without the lock:
    /// neither spare nor handed out yet, and still released as far as the app's old
    /// handle is concerned.
    pub(crate) refilling: WordSet<usize>,
    /// Granted handles the app released (the registrar reuses them): a second release of
    /// one is a double deregistration.
    pub(crate) released_grants: WordSet<usize>,
    pub count: usize,
    pub bytes: u64,
    /// Recently drained invalidations (number, start, end), newest last: a registration
    /// checks the ones that began while it was pinning pages.
    recent: VecDeque<(u64, usize, usize)>,
    /// MRs taken out of the cache and not yet deregistered, with their (pd, context): a
    /// flush before `ibv_dealloc_pd` waits for those of that PD, or the PD would still be
    /// busy. An entry leaves when its deregistration returns or unwinds.
    pub(crate) in_flight: WordMap<usize, Vec<(usize, usize)>>,
    /// Where the eviction clock hand stands.
    hand: usize,
    /// `MRCACHE_ADMIT=auto`: how often each key was seen lately (misses and locked hits,
    /// and a use of each cached entry the clock hand finds released since it last passed).
    pub(crate) sketch: Option<crate::admission::Sketch>,
    /// MRs on their way to deregistration (as `in_flight`): their length and whether they
    /// were revocable, for the admission figures.
    landing: WordMap<usize, (usize, bool)>,
    /// Per slot id: the previous and next entry of its admission class (`ClassKey`), a
    /// doubly linked list per class (`NO_ID` ends it), so a class's flip to pass-through
    /// visits that class's entries only (`evict_idle_class`).
    class_links: Vec<[u32; 2]>,
    /// Each admission class's first entry.
    class_heads: WordMap<ClassKey, u32>,
    /// Entries looked at by `evict_idle` and `evict_idle_class` so far (a test figure).
    pub(crate) examined: usize,
}

/// An entry's admission class as far as its list goes: its size class and whether it
/// asked for remote rights.
type ClassKey = (u32, bool);

const NO_ID: u32 = u32::MAX;

fn class_key(req: &Request) -> ClassKey {
    (
        crate::admission::size_class(req.len),
        req.access & access::REMOTE != 0,
    )
}

/// What `make_room` did.
pub(crate) struct Room {
    pub(crate) evicted: Vec<Mr>,
    /// One more entry of the length asked for fits now.
    pub(crate) fits: bool,
    /// The admission rule refused to evict for this key (scan resistance).
    pub(crate) refused: bool,
}

impl State {
    /// Tests only: break a class's list on purpose, its tail's next link set to `next`, or
    /// to the class's head (a cycle) with `None`. Returns how many links there are.
    #[cfg(test)]
    pub(super) fn break_class_list(
        &mut self,
        class: u32,
        remote: bool,
        next: Option<u32>,
    ) -> usize {
        let head = self.class_heads[&(class, remote)];
        let mut tail = head;
        for _ in 0..self.class_links.len() {
            match self.class_links[tail as usize][1] {
                n if n == head || n as usize >= self.class_links.len() => break,
                n => tail = n,
            }
        }
        self.class_links[tail as usize][1] = next.unwrap_or(head);
        self.class_links.len()
    }

    pub fn new() -> State {
        State {
            index: RangeIndex::new(),
            ..State::default()
        }
    }

    pub(crate) fn remember_invalidation(&mut self, number: u64, start: usize, end: usize) {
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back((number, start, end));
    }

    /// One deregistration of `ptr` returned (or the MR went back to the app).
    /// Its length and whether it was revocable, if known.
    pub(crate) fn land(&mut self, ptr: usize) -> Option<(usize, bool)> {
        if let Some(v) = self.in_flight.get_mut(&ptr) {
            v.remove(0);
            if v.is_empty() {
                self.in_flight.remove(&ptr);
            }
        }
        self.landing.remove(&ptr)
    }

    /// Whether `ptr` is a handle the app released that the cache still knows apart from
    /// the slots: a spare shadow (being refilled or not), a released grant, the pointer of
    /// an MR the cache deregistered (`f.foreign`). A release or rereg of it is a use after
    /// release.
    pub(crate) fn released(&self, f: &Fast, ptr: usize) -> bool {
        self.spare_shadows.contains(&ptr)
            || self.refilling.contains(&ptr)
            || self.released_grants.contains(&ptr)
            || f.foreign.buried(ptr)
    }

    /// Whether a registration that started when `started` invalidations had begun (none
    /// in flight) may have pinned pages that an invalidation begun since is taking away.
    /// Every invalidation numbered in `started..now` must have been drained (else we
    /// cannot tell: raced) and none may overlap the request.
    pub(crate) fn raced(&self, req: &Request, started: u64, now: u64) -> bool {
        if now == started {
            return false;
        }
        let mut seen = 0u64;
        for &(n, s, e) in self.recent.iter().rev() {
            if n >= started && n < now {
                seen += 1;
                if s < req.end() && req.addr < e {
                    return true;
                }
            }
        }
        seen != now - started
    }

    /// The entry in slot `id`, if one is (live or dead).
    pub(crate) fn entry(&self, f: &Fast, id: u32) -> Option<Entry> {
        let slot = f.slots.get(id).filter(|s| s.present())?;
        Some(Entry {
            req: slot.request(),
            mr: slot.mr(),
        })
    }

    /// Ids of every entry (live or dead, still present).
    pub(crate) fn ids(&self, f: &Fast) -> Vec<u32> {
        (0..self.next_id)
            .filter(|&id| f.slots.get(id).is_some_and(Slot::present))
            .collect()
    }

    /// Entries with their slot states.
    pub(crate) fn states<'a>(&'a self, f: &'a Fast) -> impl Iterator<Item = (Entry, u64)> + 'a {
        (0..self.next_id).filter_map(move |id| {
            let state = f.slots.get(id)?.load();
            Some((self.entry(f, id)?, state))
        })
    }

    /// The narrowest usable entry whose range holds `req`'s. One of a wider range only if
    /// `wide_ok()` (asked only then): it would keep pinned more than `req` needs.
    pub(crate) fn find_containing(
        &self,
        f: &Fast,
        req: &Request,
        limits: Limits,
        wide_ok: impl FnOnce() -> bool,
    ) -> Option<u32> {
        let mut best: Option<(usize, u32)> = None;
        self.index
            .for_each_overlap(req.addr, req.end(), |id, s, e| {
                let Some(ent) = self.entry(f, id) else { return };
                let same_range = (s, e) == (req.addr, req.end());
                let usable = ent.req.pd == req.pd
                    && ent.req.natural_iova()
                    && req.natural_iova()
                    && (same_range || limits.shadow)
                    && access::can_serve(
                        ent.req.access,
                        (s, e),
                        req.access,
                        (req.addr, req.end()),
                        limits.remote_superset,
                    );
                if usable && best.is_none_or(|(len, _)| e - s < len) {
                    best = Some((e - s, id));
                }
            });
        // A usable entry holds req's range: of req's length, it is req's range.
        best.filter(|&(len, _)| len == req.len || wide_ok())
            .map(|(_, id)| id)
    }

    /// Take a reference on entry `id` for `req` and decide which pointer the app gets.
    /// None: the entry cannot take another reference (treat as a miss).
    pub(crate) fn claim(
        &mut self,
        f: &Fast,
        id: u32,
        req: &Request,
        shadow: bool,
    ) -> Option<Claim> {
        let e = self.entry(f, id)?;
        let slot = f.slots.get(id)?;
        let same_range = (e.req.addr, e.req.len) == (req.addr, req.len);
        let mr = e.mr;
        if slot.load() & slots::REVOCABLE != 0 {
            slot.claim_other().then_some(Claim::NeedGrant { id, mr })
        } else if same_range && slot.claim_primary(!shadow) {
            Some(Claim::Ready(mr.ptr))
        } else if shadow {
            slot.claim_other().then_some(Claim::NeedShadow { id, mr })
        } else {
            None
        }
    }

    /// Drop one reference (not the provider's pointer); returns the MR to deregister when
    /// the entry is gone.
    pub(crate) fn unref(&mut self, f: &Fast, id: u32) -> Option<Mr> {
        let prev = f.slots.get(id)?.release_other();
        self.after_release(f, id, prev)
    }

    /// Drop one holding of the provider's pointer `ptr`. Err: nobody holds it.
    pub(crate) fn release_primary(&mut self, f: &Fast, ptr: usize) -> Result<Option<Mr>, ()> {
        let id = f.by_mr(ptr).ok_or(())?;
        let prev = f
            .slots
            .get(id)
            .ok_or(())?
            .release_primary(true)
            .map_err(|_| ())?;
        Ok(self.after_release(f, id, prev))
    }

    fn after_release(&mut self, f: &Fast, id: u32, prev: u64) -> Option<Mr> {
        if slots::refs(prev) == 1 && slots::dead(prev) {
            self.remove(f, id)
        } else {
            None
        }
    }

    /// Bytes of lookup metadata: the slots (the entries themselves), both tables, and the
    /// range index (its B-tree nodes estimated at their element size).
    pub fn metadata_bytes(&self, f: &Fast) -> usize {
        f.bytes()
            + self.free_ids.capacity() * 4
            + self.index.len() * 2 * size_of::<((usize, u32), usize)>()
    }

    /// A new entry held by the app: through the provider's pointer, or through `grant`.
    /// False (nothing changed): no slot left.
    pub(crate) fn insert(&mut self, f: &Fast, req: Request, mr: Mr, grant: Option<usize>) -> bool {
        let id = match self.free_ids.last() {
            Some(&id) => id,
            None => self.next_id,
        };
        // Never a retired slot (`remove` keeps them off the free list): a reset would wrap
        // its generation. Checked here too, as release builds have no debug assertions.
        let Some(slot) = f.slots.ensure(id).filter(|s| !s.retired()) else {
            return false;
        };
        slot.reset(&req, mr, grant.is_some());
        if self.free_ids.pop().is_none() {
            self.next_id += 1;
        }
        f.foreign.forget(mr.ptr);
        self.link_class(id, &req);
        self.index.insert(req.addr, req.end(), id);
        f.exact.insert(key_hash(&req), id, |i| f.slot_key_hash(i));
        f.by_mr.insert(mr_hash(mr.ptr), id, |i| f.slot_mr_hash(i));
        if let Some(h) = grant {
            self.released_grants.remove(&h);
            self.handles.insert(
                h,
                Handle::Granted {
                    id,
                    access: req.access,
                },
            );
        }
        self.count += 1;
        self.bytes += req.len as u64;
        true
    }

    /// Take the entry out of the lookup structures (it can no longer be hit) and mark it
    /// dead; the slot's previous state.
    pub(crate) fn unindex(&mut self, f: &Fast, id: u32) -> u64 {
        let Some(slot) = f.slots.get(id).filter(|s| s.present()) else {
            return slots::DEAD;
        };
        if slot.indexed() {
            let req = slot.request();
            self.index.remove(req.addr, req.end(), id);
            // Out of the table first: from then on no lookup finds it (one that found it
            // just before fails its claim once the slot is dead).
            f.exact.remove(key_hash(&req), id, |i| f.slot_key_hash(i));
            slot.set_unindexed();
        }
        slot.kill()
    }

    /// `id` (a new entry of `req`) at the head of its class's list.
    fn link_class(&mut self, id: u32, req: &Request) {
        let i = id as usize;
        if self.class_links.len() <= i {
            self.class_links.resize(i + 1, [NO_ID; 2]);
        }
        let head = self.class_heads.insert(class_key(req), id).unwrap_or(NO_ID);
        self.class_links[i] = [NO_ID, head];
        if head != NO_ID {
            self.class_links[head as usize][0] = id;
        }
    }

    /// `id` (an entry of `req` leaving the cache) out of its class's list.
    fn unlink_class(&mut self, id: u32, req: &Request) {
        let Some(&[prev, next]) = self.class_links.get(id as usize) else {
            return;
        };
        if prev != NO_ID {
            self.class_links[prev as usize][1] = next;
        } else {
            let key = class_key(req);
            if next != NO_ID {
                self.class_heads.insert(key, next);
            } else {
                self.class_heads.remove(&key);
            }
        }
        if next != NO_ID {
            self.class_links[next as usize][0] = prev;
        }
        self.class_links[id as usize] = [NO_ID; 2];
    }

    /// Forget the entry entirely; returns its MR for deregistration.
    pub(crate) fn remove(&mut self, f: &Fast, id: u32) -> Option<Mr> {
        self.unindex(f, id);
        let e = self.entry(f, id)?;
        let revocable = f
            .slots
            .get(id)
            .is_some_and(|s| s.load() & slots::REVOCABLE != 0);
        self.landing.insert(e.mr.ptr, (e.req.len, revocable));
        self.unlink_class(id, &e.req);
        f.by_mr.remove(mr_hash(e.mr.ptr), id, |i| f.slot_mr_hash(i));
        f.slots.get(id)?.set_absent();
        f.foreign.bury(e.mr.ptr);
        self.in_flight
            .entry(e.mr.ptr)
            .or_default()
            .push((e.req.pd, e.req.context));
        // A slot at its last generation is retired: a reuse would wrap the generation, and
        // a lock-free hit or release that read this entry's state word could then swap it.
        if !f.slots.get(id).is_some_and(slots::Slot::retired) {
            self.free_ids.push(id);
        }
        self.count -= 1;
        self.bytes -= e.req.len as u64;
        Some(e.mr)
    }
}
