//! Making room under the limits: what fits, eviction by the clock (with admission's
//! scan-resistant rule), the uses the clock counts, and evicting a class's idle entries.

use super::*;

impl State {
    pub(crate) fn fits(&self, len: u64, limits: Limits) -> bool {
        self.count < limits.max_entries && self.bytes.saturating_add(len) <= limits.max_bytes
    }

    /// Evict idle entries (approximately least recently used first: a clock) until one more
    /// entry of `len` bytes fits. With `candidate` (the key hash of the miss, under
    /// `MRCACHE_ADMIT=auto`), a victim is evicted only if the candidate was seen more often
    /// lately than the victim was used (`Sketch::admits`); else nothing more is evicted and
    /// `refused` is set.
    pub(crate) fn make_room(
        &mut self,
        f: &Fast,
        len: u64,
        limits: Limits,
        candidate: Option<u64>,
    ) -> Room {
        let mut evicted = Vec::new();
        if len > limits.max_bytes {
            return Room {
                evicted,
                fits: false,
                refused: false,
            };
        }
        while !self.fits(len, limits) {
            // Two passes: the first may only clear clock bits.
            let n = self.next_id as usize;
            let victim = (0..2 * n).find_map(|_| {
                let id = self.hand % n.max(1);
                self.hand = id + 1;
                let slot = f.slots.get(id as u32)?;
                if !(slot.present() && slot.indexed()) {
                    return None;
                }
                if candidate.is_some() {
                    self.note_uses(f, id as u32);
                }
                let pick = if candidate.is_some() {
                    slot.clock_idle()
                } else {
                    slot.clock_evict()
                };
                pick.then_some(id as u32)
            });
            let Some(id) = victim else {
                return Room {
                    evicted,
                    fits: false,
                    refused: false,
                };
            };
            if let (Some(c), Some(sk)) = (candidate, &self.sketch) {
                let v = f.slots.get(id).map_or(0, |s| key_hash(&s.request()));
                if !crate::admission::Sketch::admits(sk.frequency(c), sk.frequency(v)) {
                    return Room {
                        evicted,
                        fits: false,
                        refused: true,
                    };
                }
                if !f.slots.get(id).is_some_and(|s| s.kill_if_idle()) {
                    continue; // claimed meanwhile by a lock-free hit
                }
            }
            evicted.extend(self.remove(f, id));
        }
        Room {
            evicted,
            fits: true,
            refused: false,
        }
    }

    /// `MRCACHE_ADMIT=auto`: the key `req` was seen (a miss or a locked hit).
    pub(crate) fn see(&mut self, req: &Request, limits: Limits) {
        let sk = self.sketch.get_or_insert_with(|| {
            let entries = limits.max_entries.clamp(16, 1 << 17);
            let bits = (usize::BITS - (8 * entries - 1).leading_zeros()).min(20);
            crate::admission::Sketch::new(bits, 10 * entries as u64)
        });
        sk.see(key_hash(req), 1);
    }

    /// The hand passes slot `id`: an entry released since the hand last passed (its clock
    /// bit, which a last release sets) counts one use of its key.
    pub(super) fn note_uses(&mut self, f: &Fast, id: u32) {
        let Some(slot) = f.slots.get(id) else { return };
        if slot.used()
            && let Some(sk) = &mut self.sketch
        {
            sk.see(key_hash(&slot.request()), 1);
        }
    }

    pub(crate) fn evict_idle(&mut self, f: &Fast, pred: impl Fn(&Entry) -> bool) -> Vec<Mr> {
        let all = self.ids(f);
        self.evict_idle_of(f, all, pred)
    }

    /// `evict_idle` over one admission class's entries (those of `size_class` with
    /// remote rights or without, `remote`), found through its list: a flip of one class
    /// costs what that class holds, not what the whole cache does.
    pub(crate) fn evict_idle_class(
        &mut self,
        f: &Fast,
        size_class: u32,
        remote: bool,
        pred: impl Fn(&Entry) -> bool,
    ) -> Vec<Mr> {
        let mut ids = Vec::new();
        let mut at = self
            .class_heads
            .get(&(size_class, remote))
            .copied()
            .unwrap_or(NO_ID);
        // At most one step per link: a list broken into a cycle (a bug) or a link out of
        // range must not hang or panic a hook holding the cache lock.
        while at != NO_ID && ids.len() < self.class_links.len() {
            let Some(&[_, next]) = self.class_links.get(at as usize) else {
                break;
            };
            ids.push(at);
            at = next;
        }
        self.evict_idle_of(f, ids, pred)
    }

    pub(super) fn evict_idle_of(
        &mut self,
        f: &Fast,
        candidates: Vec<u32>,
        pred: impl Fn(&Entry) -> bool,
    ) -> Vec<Mr> {
        self.examined += candidates.len();
        let ids: Vec<u32> = candidates
            .into_iter()
            .filter(|&id| f.slots.get(id).is_some_and(Slot::indexed))
            .filter(|&id| self.entry(f, id).is_some_and(|e| pred(&e)))
            .filter(|&id| f.slots.get(id).is_some_and(|s| s.kill_if_idle()))
            .collect();
        ids.iter().filter_map(|&id| self.remove(f, id)).collect()
    }
}
