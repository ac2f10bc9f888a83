//! What the cache lock guards, and the lookup structures the hit path shares with it.
//!
//! `Fast` (the exact-key map, the MR map and the slots) is read by the hit path without the
//! cache lock; entries enter and leave it only under the lock. `State` holds the rest: the
//! range index (containing-range lookups and invalidation), each entry's request, the
//! handles that are not the provider's own pointer, and the bookkeeping of what was
//! deregistered.

use super::shards::{Shard, Shards};
use super::slots::{self, Slots};
use super::types::{Limits, Mr, Request};
use crate::access;
use crate::index::RangeIndex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::MutexGuard;

/// How many drained invalidations are remembered for the registration race check.
const RECENT: usize = 1024;
/// How many deregistered MR pointers are remembered to catch double deregistrations.
const TOMBSTONES: usize = 4096;

pub type Key = (usize, usize, usize, u32, u64);

pub fn key(r: &Request) -> Key {
    (r.pd, r.addr, r.len, r.access, r.iova)
}

#[derive(Default)]
pub struct Fast {
    pub slots: Slots,
    /// Every live entry by its exact request: the hit path's lookup.
    pub exact: Shards<Key, u32>,
    /// Every entry by its provider MR pointer: the release path's lookup.
    pub by_mr: Shards<usize, u32>,
}

/// Both maps locked (across `fork()`).
pub struct FastGuards<'a> {
    exact: Vec<MutexGuard<'a, Shard<Key, u32>>>,
    by_mr: Vec<MutexGuard<'a, Shard<usize, u32>>>,
}

impl Fast {
    pub fn lock_all(&self) -> FastGuards<'_> {
        FastGuards {
            exact: self.exact.lock_all(),
            by_mr: self.by_mr.lock_all(),
        }
    }
}

impl FastGuards<'_> {
    pub fn clear(&mut self) {
        self.exact.iter_mut().for_each(|m| m.clear());
        self.by_mr.iter_mut().for_each(|m| m.clear());
    }
}

pub struct Entry {
    pub req: Request,
    pub mr: Mr,
    /// In the range index and the exact map.
    indexed: bool,
}

pub enum Handle {
    Shadow {
        id: u32,
    },
    /// A handle with its own remote key (`Registrar::grant`), revoked at release.
    Granted {
        id: u32,
    },
    Uncached {
        mr: Mr,
    },
}

pub enum Claim {
    Ready(usize),
    NeedShadow { id: u32, mr: Mr },
    NeedGrant { id: u32, mr: Mr },
}

#[derive(Default)]
pub struct State {
    entries: Vec<Option<Entry>>,
    free_ids: Vec<u32>,
    pub index: RangeIndex,
    /// Handles other than the provider's own pointer (those are counted in the slots).
    pub handles: HashMap<usize, Handle>,
    pub spare_shadows: HashSet<usize>,
    /// Granted handles the app released (the registrar reuses them): a second release of
    /// one is a double deregistration.
    pub released_grants: HashSet<usize>,
    pub count: usize,
    pub bytes: u64,
    /// Pointers of MRs the cache deregistered after the app had released them, newest last
    /// (bounded): a later `ibv_dereg_mr` of one is a double deregistration, and must not
    /// reach libibverbs with freed memory.
    tombstones: VecDeque<usize>,
    pub tombstone_set: HashSet<usize>,
    /// Recently drained invalidations (number, start, end), newest last: a registration
    /// checks the ones that began while it was pinning pages.
    recent: VecDeque<(u64, usize, usize)>,
    /// MRs taken out of the cache and not yet deregistered, with their (pd, context): a
    /// flush before `ibv_dealloc_pd` waits for those of that PD, or the PD would still be
    /// busy. An entry leaves when its deregistration returns or unwinds.
    pub in_flight: HashMap<usize, Vec<(usize, usize)>>,
    /// Where the eviction clock hand stands.
    hand: usize,
}

impl State {
    pub fn new() -> State {
        State {
            index: RangeIndex::new(),
            ..State::default()
        }
    }

    pub fn remember_invalidation(&mut self, number: u64, start: usize, end: usize) {
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back((number, start, end));
    }

    /// One deregistration of `ptr` returned (or the MR went back to the app).
    pub fn land(&mut self, ptr: usize) {
        if let Some(v) = self.in_flight.get_mut(&ptr) {
            v.remove(0);
            if v.is_empty() {
                self.in_flight.remove(&ptr);
            }
        }
    }

    pub fn bury(&mut self, ptr: usize) {
        if self.tombstone_set.insert(ptr) {
            self.tombstones.push_back(ptr);
            if self.tombstones.len() > TOMBSTONES
                && let Some(old) = self.tombstones.pop_front()
            {
                self.tombstone_set.remove(&old);
            }
        }
    }

    /// A live MR now has this address (the allocator reused it).
    pub fn unbury(&mut self, ptr: usize) {
        if self.tombstone_set.remove(&ptr) {
            self.tombstones.retain(|&p| p != ptr);
        }
    }

    /// Whether a registration that started when `started` invalidations had begun (none
    /// in flight) may have pinned pages that an invalidation begun since is taking away.
    /// Every invalidation numbered in `started..now` must have been drained (else we
    /// cannot tell: raced) and none may overlap the request.
    pub fn raced(&self, req: &Request, started: u64, now: u64) -> bool {
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

    pub fn entry(&self, id: u32) -> Option<&Entry> {
        self.entries.get(id as usize).and_then(Option::as_ref)
    }

    /// Ids of every entry (live or dead, still present).
    pub fn ids(&self) -> Vec<u32> {
        (0..self.entries.len() as u32)
            .filter(|&id| self.entry(id).is_some())
            .collect()
    }

    /// Entries with their slot states.
    pub fn states<'a>(&'a self, f: &'a Fast) -> impl Iterator<Item = (&'a Entry, u64)> + 'a {
        self.entries
            .iter()
            .enumerate()
            .filter_map(move |(id, e)| Some((e.as_ref()?, f.slots.get(id as u32)?.load())))
    }

    pub fn find_containing(&self, req: &Request, limits: Limits) -> Option<u32> {
        let mut best: Option<(usize, u32)> = None;
        self.index
            .for_each_overlap(req.addr, req.end(), |id, s, e| {
                let Some(ent) = self.entry(id) else { return };
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
        best.map(|(_, id)| id)
    }

    /// Take a reference on entry `id` for `req` and decide which pointer the app gets.
    /// None: the entry cannot take another reference (treat as a miss).
    pub fn claim(&mut self, f: &Fast, id: u32, req: &Request, shadow: bool) -> Option<Claim> {
        let e = self.entry(id)?;
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
    pub fn unref(&mut self, f: &Fast, id: u32) -> Option<Mr> {
        let prev = f.slots.get(id)?.release_other();
        self.after_release(f, id, prev)
    }

    /// Drop one holding of the provider's pointer `ptr`. Err: nobody holds it.
    pub fn release_primary(&mut self, f: &Fast, ptr: usize) -> Result<Option<Mr>, ()> {
        let id = f.by_mr.get(&ptr).ok_or(())?;
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

    /// Bytes of lookup metadata: the slots, both maps' tables, the entries and the range
    /// index (its B-tree nodes estimated at their element size).
    pub fn metadata_bytes(&self, f: &Fast) -> usize {
        f.slots.bytes()
            + f.exact.table_bytes()
            + f.by_mr.table_bytes()
            + self.entries.capacity() * size_of::<Option<Entry>>()
            + self.free_ids.capacity() * 4
            + self.index.len() * 2 * size_of::<((usize, u32), usize)>()
    }

    pub fn fits(&self, len: u64, limits: Limits) -> bool {
        self.count < limits.max_entries && self.bytes.saturating_add(len) <= limits.max_bytes
    }

    /// Evict idle entries (approximately least recently used first: a clock) until one more
    /// entry of `len` bytes fits. Returns the evicted MRs and whether it now fits.
    pub fn make_room(&mut self, f: &Fast, len: u64, limits: Limits) -> (Vec<Mr>, bool) {
        let mut evicted = Vec::new();
        if len > limits.max_bytes {
            return (evicted, false);
        }
        while !self.fits(len, limits) {
            // Two passes: the first may only clear clock bits.
            let n = self.entries.len();
            let victim = (0..2 * n).find_map(|_| {
                let id = self.hand % n.max(1);
                self.hand = id + 1;
                let live = self.entry(id as u32).is_some_and(|e| e.indexed);
                (live && f.slots.get(id as u32)?.clock_evict()).then_some(id as u32)
            });
            let Some(id) = victim else {
                return (evicted, false);
            };
            evicted.extend(self.remove(f, id));
        }
        (evicted, true)
    }

    pub fn evict_idle(&mut self, f: &Fast, pred: impl Fn(&Entry) -> bool) -> Vec<Mr> {
        let ids: Vec<u32> = self
            .ids()
            .into_iter()
            .filter(|&id| self.entry(id).is_some_and(|e| e.indexed && pred(e)))
            .filter(|&id| f.slots.get(id).is_some_and(|s| s.kill_if_idle()))
            .collect();
        ids.iter().filter_map(|&id| self.remove(f, id)).collect()
    }

    /// A new entry held by the app: through the provider's pointer, or through `grant`.
    /// False (nothing changed): no slot left.
    pub fn insert(&mut self, f: &Fast, req: Request, mr: Mr, grant: Option<usize>) -> bool {
        let id = match self.free_ids.last() {
            Some(&id) => id,
            None => self.entries.len() as u32,
        };
        let Some(slot) = f.slots.ensure(id) else {
            return false;
        };
        slot.reset(mr.ptr, grant.is_some());
        let e = Entry {
            req,
            mr,
            indexed: true,
        };
        if self.free_ids.pop().is_some() {
            self.entries[id as usize] = Some(e);
        } else {
            self.entries.push(Some(e));
        }
        self.unbury(mr.ptr);
        self.index.insert(req.addr, req.end(), id);
        f.exact.insert(key(&req), id);
        f.by_mr.insert(mr.ptr, id);
        if let Some(h) = grant {
            self.released_grants.remove(&h);
            self.handles.insert(h, Handle::Granted { id });
        }
        self.count += 1;
        self.bytes += req.len as u64;
        true
    }

    /// Take the entry out of the lookup structures (it can no longer be hit) and mark it
    /// dead; the slot's previous state.
    pub fn unindex(&mut self, f: &Fast, id: u32) -> u64 {
        let Some(e) = self.entries.get_mut(id as usize).and_then(Option::as_mut) else {
            return slots::DEAD;
        };
        if e.indexed {
            e.indexed = false;
            let req = e.req;
            self.index.remove(req.addr, req.end(), id);
            // Out of the map first: from then on no hit can claim it.
            f.exact.remove_if(&key(&req), |&v| v == id);
        }
        f.slots.get(id).map_or(slots::DEAD, |s| s.kill())
    }

    /// Forget the entry entirely; returns its MR for deregistration.
    pub fn remove(&mut self, f: &Fast, id: u32) -> Option<Mr> {
        self.unindex(f, id);
        let e = self.entries.get_mut(id as usize)?.take()?;
        f.by_mr.remove_if(&e.mr.ptr, |&v| v == id);
        self.bury(e.mr.ptr);
        self.in_flight
            .entry(e.mr.ptr)
            .or_default()
            .push((e.req.pd, e.req.context));
        self.free_ids.push(id);
        self.count -= 1;
        self.bytes -= e.req.len as u64;
        Some(e.mr)
    }
}
