//! TinyLFU's frequency sketch: the scan-resistance rule admission applies when the cache is full.

/// The scan-resistant admission rule applied when the cache is full: a miss may evict
/// the clock's victim only if it was seen more often lately than the victim was used
/// (TinyLFU's rule over the clock; see docs/design/admission.md). Frequencies are small saturating
/// counters, halved every `period` sightings so the past fades.
#[derive(Debug, Clone)]
pub struct Sketch {
    counters: Vec<u8>,
    mask: usize,
    sightings: u64,
    period: u64,
}

const SKETCH_MAX: u8 = 15;

impl Sketch {
    /// A sketch of `2^bits` counters, halved every `period` sightings.
    pub fn new(bits: u32, period: u64) -> Sketch {
        let n = 1usize << bits.clamp(4, 20);
        Sketch {
            counters: vec![0; n],
            mask: n - 1,
            sightings: 0,
            period: period.max(16),
        }
    }

    fn index(&self, hash: u64, row: u64) -> usize {
        let h = hash
            .wrapping_add(row.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .wrapping_mul(0xff51_afd7_ed55_8ccd);
        ((h ^ (h >> 29)) as usize) & self.mask
    }

    /// How often `hash` was seen lately (the smallest of its 4 counters).
    pub fn frequency(&self, hash: u64) -> u8 {
        (0..4)
            .map(|r| self.counters[self.index(hash, r)])
            .min()
            .unwrap_or(0)
    }

    /// `hash` was seen `n` times more.
    pub fn see(&mut self, hash: u64, n: u64) {
        let f = self.frequency(hash);
        let to = f
            .saturating_add(n.min(SKETCH_MAX as u64) as u8)
            .min(SKETCH_MAX);
        for r in 0..4 {
            let i = self.index(hash, r);
            // Conservative update: raise only the counters below the new estimate.
            if self.counters[i] < to {
                self.counters[i] = to;
            }
        }
        self.sightings += n;
        if self.sightings >= self.period {
            self.sightings = 0;
            for c in &mut self.counters {
                *c /= 2;
            }
        }
    }

    /// The rule: a candidate seen `candidate` times may displace a victim used `victim`
    /// times only if strictly more (a tie keeps what is cached: in a cyclic scan larger
    /// than the cache every key ties, and the cache keeps its share instead of thrashing).
    pub fn admits(candidate: u8, victim: u8) -> bool {
        candidate > victim
    }
}
