//! The registry of MR addresses that are not the cache's: registrations passed through to
//! libibverbs (their `ibv_dereg_mr` goes straight back to libibverbs, timed when the
//! registration was an admission sample) and tombstones, the MRs the cache deregistered (a
//! second `ibv_dereg_mr` of one is a double deregistration, never handed to libibverbs with
//! freed memory). One lock-free table answers the dereg hook's "is this a pass-through?"
//! in one look at one cache line, and the locked path's "did the cache deregister it?".
//!
//! Each word is an MR address (8-byte aligned, below 2^48, its top-byte tag stripped) with
//! its kind in the low three bits and, above bit 48, the size class of a timed pass-through
//! or the burial stamp of a tombstone. An address has one home group of eight words (a
//! 64-byte line); every write looks for its address in the group first, so an address is
//! held once and a pass-through at a tombstone's address (the allocator reused it)
//! replaces the tombstone in place. A full group is split in halves (`room`): a burial
//! takes a live pass-through's word while the group holds fewer than four tombstones, else
//! the oldest tombstone's; a pass-through takes the oldest tombstone's only while the group
//! holds more than four. So every group keeps its four newest tombstones whatever the
//! pass-throughs do, and up to eight where they leave room. A pass-through not recorded,
//! or pushed out by a burial, loses only its lock-free way back: its `ibv_dereg_mr` asks
//! the cache under the lock, which answers that the MR is not its own.
//!
//! Why a pass-through found here is libibverbs' and never the cache's: an address is
//! recorded when libibverbs returns that MR to the app, and taken out before its
//! `ibv_dereg_mr` reaches libibverbs (the only call that frees it), so while it is here no
//! other live object has that address. An MR freed behind our hooks (a dereg nested in one
//! of our calls goes to libibverbs untouched) leaves its address behind; every address the
//! cache itself hands out is therefore forgotten here when the cache gets it (`forget`).
//! Why no tombstone is missed by a pass-through at its address: the cache buries an MR
//! before it deregisters it, so before the allocator can hand the address out again.
//!
//! No lock, no allocation, no panic: called from the hooks, and from under the cache lock.

use crate::admission::size_class;
use std::sync::atomic::{AtomicUsize, Ordering::*};

/// Groups in the table (a power of two): 16,384 words, 128 KiB.
const GROUPS: usize = 2048;
const WIDTH: usize = 8;
/// The word's kind bits.
const KIND: usize = 7;
/// A registration passed through to libibverbs.
const PASSED: usize = 1;
/// A pass-through that was an admission sample: its deregistration is timed too.
const TIMED: usize = 2;
/// An MR the cache deregistered.
const BURIED: usize = 3;
const META_SHIFT: u32 = 48;
const ADDRESS: usize = (1 << META_SHIFT) - 1 - KIND;
/// The top byte of a pointer: a tag on aarch64 (TBI, MTE) and under x86-64's LAM, never an
/// address bit of user memory. An address is held without it.
const TAG: usize = 0xff << 56;
/// Of a group's words, how many tombstones keep from live pass-throughs, and pass-throughs
/// from tombstones.
const HALF: usize = WIDTH / 2;
/// A write that keeps losing its group's races gives up (a pass-through then takes the
/// locked path; a tombstone is not kept).
const TRIES: usize = 4;

#[repr(align(64))]
#[derive(Default)]
struct Group([AtomicUsize; WIDTH]);

/// A pass-through taken out of the registry (`Foreign::take`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Passed {
    /// Its deregistration is nobody's figure.
    Untimed,
    /// An admission sample of this many bytes (the power of two that ends its size
    /// class): time its deregistration too (`Cache::report`, `Sample::Deregistration`).
    Timed(usize),
}

pub(super) struct Foreign {
    groups: Box<[Group]>,
    /// Pass-throughs recorded now: zero lets a cache that passes nothing through skip the
    /// table on every deregistration.
    passed: AtomicUsize,
    /// Burials so far: the stamp that finds a group's oldest tombstone.
    burials: AtomicUsize,
}

impl Default for Foreign {
    fn default() -> Foreign {
        Foreign {
            groups: (0..GROUPS).map(|_| Group::default()).collect(),
            passed: AtomicUsize::new(0),
            burials: AtomicUsize::new(0),
        }
    }
}

fn kind(w: usize) -> usize {
    w & KIND
}

fn address(w: usize) -> usize {
    w & ADDRESS
}

fn live(w: usize) -> bool {
    matches!(kind(w), PASSED | TIMED)
}

/// The address of `ptr` as the table holds it (its tag stripped), if it can: 8-byte
/// aligned, not null, below 2^48.
fn key(ptr: usize) -> Option<usize> {
    let k = ptr & !TAG;
    (k != 0 && k & !ADDRESS == 0).then_some(k)
}

impl Foreign {
    fn group(&self, ptr: usize) -> &[AtomicUsize; WIDTH] {
        let home =
            (ptr as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - GROUPS.trailing_zeros());
        &self.groups[home as usize].0
    }

    /// The memory the table takes.
    pub(super) fn bytes(&self) -> usize {
        self.groups.len() * size_of::<Group>()
    }

    /// Write `new` (an address with its kind) in its group: over the word that holds its
    /// address, else an empty one, else as `room` says. Returns the word replaced (0: an
    /// empty one), or None when there was no room.
    fn put(&self, new: usize) -> Option<usize> {
        let ptr = address(new);
        let group = self.group(ptr);
        'tries: for _ in 0..TRIES {
            let mut empty = WIDTH;
            for (i, slot) in group.iter().enumerate() {
                let w = slot.load(Acquire);
                if w == 0 {
                    empty = empty.min(i);
                } else if address(w) == ptr {
                    if slot.compare_exchange(w, new, AcqRel, Relaxed).is_ok() {
                        return Some(w);
                    }
                    continue 'tries;
                }
            }
            let (i, w) = if empty < WIDTH {
                (empty, 0)
            } else {
                self.room(group, kind(new) == BURIED)?
            };
            if group[i].compare_exchange(w, new, AcqRel, Relaxed).is_ok() {
                return Some(w);
            }
        }
        None
    }

    /// A full group's word to write over, split in halves: a tombstone takes a live
    /// pass-through's word while the group holds fewer than `HALF` tombstones (that MR's
    /// deregistration then asks the cache under the lock, which answers that it is not the
    /// cache's), else the oldest tombstone's; a pass-through takes the oldest tombstone's
    /// while the group holds more than `HALF`, else none. So a group always keeps its
    /// `HALF` newest tombstones, however many pass-throughs are live.
    #[cold]
    fn room(&self, group: &[AtomicUsize; WIDTH], burial: bool) -> Option<(usize, usize)> {
        let now = self.burials.load(Relaxed);
        // Burials since the stamp, modulo 2^16 (a tombstone 65,536 burials old is taken for
        // a new one); one made after `now` was read (a burial under the cache lock while a
        // note scans: a few at most) is the newest.
        let age = |w: usize| match now.wrapping_sub(w >> META_SHIFT) & 0xffff {
            ahead if ahead > 0xffff - WIDTH * 2 => 0,
            age => age,
        };
        // One look at the group: the choice is made on one snapshot (each write it leads
        // to expects the word it saw).
        let seen: [usize; WIDTH] = std::array::from_fn(|i| group[i].load(Acquire));
        let words = seen.into_iter().enumerate();
        let tombs = seen.iter().filter(|&&w| kind(w) == BURIED).count();
        let oldest = words
            .clone()
            .filter(|&(_, w)| kind(w) == BURIED)
            .max_by_key(|&(_, w)| age(w));
        if burial && tombs < HALF {
            // An untimed pass-through first: a timed one is an admission sample.
            return words
                .filter(|&(_, w)| live(w))
                .min_by_key(|&(_, w)| kind(w) == TIMED)
                .or(oldest);
        }
        if !burial && tombs <= HALF {
            return None;
        }
        oldest
    }

    /// `ptr` is an MR libibverbs made, live from now on (`timed`: the length of an
    /// admission sample, whose deregistration is timed too). A tombstone of it goes. False:
    /// not recorded (its deregistration asks the cache).
    pub(super) fn note(&self, ptr: usize, timed: Option<usize>) -> bool {
        let Some(ptr) = key(ptr) else {
            return false;
        };
        let new = match timed {
            None => ptr | PASSED,
            Some(len) => ptr | TIMED | (size_class(len).min(63) as usize) << META_SHIFT,
        };
        match self.put(new) {
            Some(w) if live(w) => true,
            Some(_) => {
                self.passed.fetch_add(1, AcqRel);
                true
            }
            None => false,
        }
    }

    /// Take pass-through `ptr` out: Some when it was recorded.
    #[inline]
    pub(super) fn take(&self, ptr: usize) -> Option<Passed> {
        if self.passed.load(Acquire) == 0 {
            return None;
        }
        let ptr = key(ptr)?;
        for slot in self.group(ptr) {
            let w = slot.load(Acquire);
            if address(w) == ptr && live(w) && slot.compare_exchange(w, 0, AcqRel, Relaxed).is_ok()
            {
                self.passed.fetch_sub(1, AcqRel);
                return Some(match kind(w) {
                    TIMED => Passed::Timed(1 << (w >> META_SHIFT)),
                    _ => Passed::Untimed,
                });
            }
        }
        None
    }

    /// The cache is about to deregister its MR `ptr`: a later `ibv_dereg_mr` of it is a
    /// double deregistration. Before the deregistration, so before the address can be
    /// handed out again.
    pub(super) fn bury(&self, ptr: usize) {
        let Some(ptr) = key(ptr) else {
            return;
        };
        let stamp = self.burials.fetch_add(1, Relaxed).wrapping_add(1) & 0xffff;
        if let Some(w) = self.put(ptr | BURIED | stamp << META_SHIFT)
            && live(w)
        {
            self.passed.fetch_sub(1, AcqRel);
        }
    }

    /// Whether `ptr` is the address of an MR the cache deregistered (a tombstone).
    pub(super) fn buried(&self, ptr: usize) -> bool {
        key(ptr).is_some_and(|ptr| {
            self.group(ptr).iter().any(|s| {
                let w = s.load(Acquire);
                address(w) == ptr && kind(w) == BURIED
            })
        })
    }

    /// The cache got `ptr` as a handle of its own (a provider registration's MR, a shadow
    /// or grant slot, an MR handed back to the app): neither a pass-through's (whatever an
    /// MR freed behind our hooks left) nor a tombstone any more.
    pub(super) fn forget(&self, ptr: usize) {
        let Some(ptr) = key(ptr) else {
            return;
        };
        for slot in self.group(ptr) {
            let mut w = slot.load(Acquire);
            while w != 0 && address(w) == ptr {
                match slot.compare_exchange(w, 0, AcqRel, Acquire) {
                    Ok(_) => {
                        if live(w) {
                            self.passed.fetch_sub(1, AcqRel);
                        }
                        break;
                    }
                    Err(now) => w = now,
                }
            }
        }
    }
}

impl<R: super::Registrar> super::Cache<R> {
    /// `mr` is an MR libibverbs made for a registration passed through (or another call
    /// of ours): live, not a tombstone, and its `ibv_dereg_mr` may skip the cache
    /// (`take_passed`). Lock-free: also for a registration nested in one of our calls,
    /// whose cache lock this thread may hold.
    #[inline]
    pub fn note_foreign(&self, mr: usize) {
        self.fast.foreign.note(mr, None);
    }

    /// The app's `ibv_dereg_mr(mr)`, asked before the cache's own `release_at`: Some when
    /// `mr` is a registration passed through to libibverbs (taken out: the caller hands it
    /// to libibverbs; `Passed::Timed`: time that and report it,
    /// `Sample::Deregistration`); None: ask `release_at`.
    #[inline]
    pub fn take_passed(&self, mr: usize) -> Option<Passed> {
        self.fast.foreign.take(mr)
    }

    /// `ptr`, a grant or shadow slot the registrar just gave, forgotten by the registry.
    pub(super) fn mine(&self, ptr: usize) -> usize {
        self.fast.foreign.forget(ptr);
        ptr
    }
}

#[cfg(test)]
mod tests;
