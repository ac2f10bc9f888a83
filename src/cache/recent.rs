//! Where the release of a lock-free hit finds its slot without probing the MR-pointer
//! table: the hit writes the slot id into a small array of cache lines, one line chosen
//! by the caller's stack (so, as a rule, by thread) and the word in it by a few bits of the
//! MR pointer (shifts and xors, not the tables' multiply: the release's lookup waits on it);
//! the release reads that word back. A reg+dereg pair then touches the key table's word and
//! the slot, and the release reads only lines the hit just had in cache: one random
//! memory access fewer per pair in a cache too large for the CPU's caches.
//!
//! A word is a candidate, never an answer, exactly as a word of the MR-pointer table is:
//! the release checks the slot against the pointer and swaps the very state word it
//! checked (`Slot::release_if_mr`), so a stale word, another thread's word, or a pointer
//! the cache never handed out that lands on a word releases nothing, and the release falls
//! back to the table. Threads whose stacks share a line only overwrite each other's words
//! (a slower release, never a wrong one).

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// Lines of words; a power of two.
const LINES: usize = 256;
/// Words per 64-byte line.
const WAYS: usize = 16;
/// Stack addresses within this many bits share a line: a thread's hooks run at depths a
/// few KiB apart, and threads' stacks (8 MiB by default) do not share 64 KiB; threads on
/// smaller stacks may share a line, which costs their releases the table, nothing more.
#[cfg_attr(test, allow(dead_code))]
const STACK_SHIFT: u32 = 16;

#[repr(align(64))]
#[derive(Default)]
struct Line([AtomicU32; WAYS]);

/// A slot id plus one per word (0: none), written by hits, read by releases.
pub(crate) struct RecentHits {
    /// A fixed-size array: `line_index` is below `LINES` by construction, no bounds check.
    lines: Box<[Line; LINES]>,
}

impl Default for RecentHits {
    fn default() -> Self {
        let lines: Box<[Line]> = (0..LINES).map(|_| Line::default()).collect();
        RecentHits {
            lines: lines.try_into().unwrap_or_else(|_| unreachable!()),
        }
    }
}

/// The calling thread's line: from the address of a local, i.e. the stack it runs on.
#[cfg(not(test))]
#[inline(always)]
fn line_index() -> usize {
    let here = 0u8;
    let sp = std::ptr::addr_of!(here) as usize;
    ((sp >> STACK_SHIFT) as u64).wrapping_mul(super::hash::MUL) as usize
        >> (usize::BITS - LINES.ilog2())
}

/// Unit tests: one line per thread, whatever the frame. A hit and its release in frames
/// either side of a 64 KiB stack boundary use two lines (a slower release, never a wrong
/// one), which made a test's release through the word fail about once in a hundred runs;
/// the stack-address choice itself is exercised by the integration tests
/// (`tests/cache/recent_hit_races.rs`), which build the library without `cfg(test)`.
#[cfg(test)]
fn line_index() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static LINE: usize = NEXT.fetch_add(1, Relaxed) % LINES);
    LINE.with(|l| *l)
}

/// Providers allocate MRs from malloc (16-byte aligned, 64 bytes and up apart): bits 4-7
/// folded with bits 10-13.
#[inline(always)]
fn way(mr: usize) -> usize {
    ((mr >> 4) ^ (mr >> 10)) & (WAYS - 1)
}

impl RecentHits {
    #[inline(always)]
    fn word(&self, mr: usize) -> &AtomicU32 {
        &self.lines[line_index()].0[way(mr)]
    }

    /// After a lock-free hit handed out the MR pointer `mr` from slot `id`.
    /// Written only when it changes, so a line two threads share is not written back and
    /// forth by hits on the same entries.
    #[inline(always)]
    pub(crate) fn remember(&self, mr: usize, id: u32) {
        let w = self.word(mr);
        let v = id.wrapping_add(1);
        if w.load(Relaxed) != v {
            w.store(v, Relaxed);
        }
    }

    /// The slot a recent hit on this thread handed the MR pointer `mr` out of, maybe:
    /// unvalidated.
    #[inline(always)]
    pub(crate) fn candidate(&self, mr: usize) -> Option<u32> {
        self.word(mr).load(Relaxed).checked_sub(1)
    }

    /// Plant `id` under `mr` for the calling thread (tests: a stale or foreign word).
    #[cfg(test)]
    pub(crate) fn plant(&self, mr: usize, id: u32) {
        self.word(mr).store(id.wrapping_add(1), Relaxed);
    }

    pub fn bytes(&self) -> usize {
        self.lines.len() * size_of::<Line>()
    }
}
