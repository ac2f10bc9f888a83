//! Probe lengths of the exact-key hash (`key_hash`) for realistic
//! keys, against a random hash, in a linear-probing table at the cache's load (3/4 at
//! growth).

use super::state::key_hash;
use super::types::Request;

/// `[pd, addr, len, access, iova]`
fn hash(k: [u64; 5]) -> u64 {
    key_hash(&Request {
        pd: k[0] as usize,
        context: 0,
        addr: k[1] as usize,
        len: k[2] as usize,
        access: k[3] as u32,
        iova: k[4],
    })
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// (mean displacement, max displacement, mean tag-matching foreign words per lookup)
fn probe(hashes: &[u64]) -> (f64, usize, f64) {
    let n = hashes.len();
    let mut size = 16usize;
    while n * 4 > size * 3 {
        size *= 2;
    }
    let mask = size - 1;
    let mut t: Vec<Option<u64>> = vec![None; size];
    let (mut sum, mut max) = (0usize, 0usize);
    for &h in hashes {
        let mut i = h as usize & mask;
        let mut d = 0;
        while t[i].is_some() {
            i = (i + 1) & mask;
            d += 1;
        }
        t[i] = Some(h);
        sum += d;
        max = max.max(d);
    }
    // Foreign words with the same 9-bit tag met on a successful lookup.
    let mut tagged = 0usize;
    for &h in hashes {
        let mut i = h as usize & mask;
        while let Some(w) = t[i] {
            if w == h {
                break;
            }
            if w >> 55 == h >> 55 {
                tagged += 1;
            }
            i = (i + 1) & mask;
        }
    }
    (sum as f64 / n as f64, max, tagged as f64 / n as f64)
}

fn report(name: &str, keys: &[[u64; 5]]) -> (f64, usize) {
    let h: Vec<u64> = keys.iter().map(|k| hash(*k)).collect();
    let mut uniq = h.clone();
    uniq.sort();
    uniq.dedup();
    let r: Vec<u64> = (0..keys.len() as u64)
        .map(|i| splitmix(i ^ 0xabc))
        .collect();
    let (m, x, tg) = probe(&h);
    let (rm, rx, rtg) = probe(&r);
    eprintln!(
        "{name:34} n={:7} dup={:3} mean={m:6.2} max={x:5} tagfp={tg:.3} | random mean={rm:.2} max={rx} tagfp={rtg:.3}",
        keys.len(),
        keys.len() - uniq.len()
    );
    assert_eq!(uniq.len(), keys.len(), "{name}: full-hash collisions");
    (m / rm, x)
}

#[test]
#[allow(clippy::vec_init_then_push)] // one set per push, each with its name
fn key_hash_probe_lengths_for_realistic_keys() {
    let pd = 0x5555_5555_a000u64;
    let base = 0x7f12_3400_0000u64;
    let n = 200_000u64;
    let mut sets: Vec<(&str, Vec<[u64; 5]>)> = Vec::new();
    sets.push((
        "4K pages, iova=addr",
        (0..n)
            .map(|i| [pd, base + i * 4096, 4096, 1, base + i * 4096])
            .collect(),
    ));
    sets.push((
        "2M pages, iova=addr",
        (0..n)
            .map(|i| [pd, base + (i << 21), 2 << 20, 7, base + (i << 21)])
            .collect(),
    ));
    sets.push((
        "1G steps, iova=addr",
        (0..n)
            .map(|i| [pd, (i << 30), 1 << 30, 1, (i << 30)])
            .collect(),
    ));
    sets.push((
        "4K, iova = i*4K (small)",
        (0..n)
            .map(|i| [pd, base + i * 4096, 4096, 1, i * 4096])
            .collect(),
    ));
    sets.push((
        "4K, iova = addr+1T",
        (0..n)
            .map(|i| [pd, base + i * 4096, 4096, 1, base + i * 4096 + (1 << 40)])
            .collect(),
    ));
    sets.push((
        "64B slices",
        (0..n)
            .map(|i| [pd, base + i * 64, 64, 1, base + i * 64])
            .collect(),
    ));
    sets.push((
        "one base, len = i*4K",
        (0..n)
            .map(|i| [pd, base, (i + 1) * 4096, 1, base])
            .collect(),
    ));
    sets.push((
        "base+i*4K, len=(n-i)*4K",
        (0..n)
            .map(|i| [pd, base + i * 4096, (n - i) * 4096, 1, base + i * 4096])
            .collect(),
    ));
    sets.push((
        "addr=iova=len=i*4K",
        (0..n)
            .map(|i| [pd, (i + 1) * 4096, (i + 1) * 4096, 1, (i + 1) * 4096])
            .collect(),
    ));
    // Same buffers on many PDs (malloc'd, 0x40 apart .. 0x1000 apart) and access flags.
    let mut many = Vec::new();
    for p in 0..64u64 {
        for a in [1u64, 3, 5, 7, 9, 15] {
            for i in 0..512u64 {
                many.push([pd + p * 0x1000, base + i * 4096, 4096, a, base + i * 4096]);
            }
        }
    }
    sets.push(("64 PDs x 6 access x 512 bufs", many));
    let mut pds = Vec::new();
    for p in 0..4096u64 {
        for i in 0..48u64 {
            pds.push([
                pd + p * 0x40,
                base + i * 0x10_0000,
                0x10_0000,
                7,
                base + i * 0x10_0000,
            ]);
        }
    }
    sets.push(("4096 PDs 0x40 apart x 48 1M bufs", pds));
    // The same buffers at many iovas (the PD and the iova share a word of the hash).
    let mut iovas = Vec::new();
    for j in 0..64u64 {
        for i in 0..3125u64 {
            iovas.push([pd, base + i * 4096, 4096, 1, (j << 30) + i * 4096]);
        }
    }
    sets.push(("3125 bufs x 64 iovas", iovas));
    let mut worst = 0.0f64;
    for (name, keys) in &sets {
        let (ratio, _) = report(name, keys);
        worst = worst.max(ratio);
    }
    assert!(
        worst < 2.0,
        "a key set probes {worst:.1}x longer than random"
    );
}
