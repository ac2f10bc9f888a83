//! Whether the device's on-demand transfers land where they were sent: RDMA WRITEs into a
//! fresh on-demand registration, one at an offset within a page, one at a page boundary,
//! and the memory read back.

use super::super::verbs::{Buffer, Pd};
use super::LOCAL_WRITE;
use super::device::{ACCESS_ON_DEMAND, ACCESS_REMOTE_WRITE, Loopback};

/// The registration's pages (two: the boundary write goes to the second).
const PAGE: usize = 4096;
/// Where the write within a page goes, and how long each write is.
pub const WITHIN: usize = 100;
pub const LEN: usize = 64;
/// What the registration holds before the writes (the patterns never contain it).
const BACKGROUND: u8 = 0x5a;

/// What the check saw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Offsets {
    /// The write at `WITHIN` bytes landed there, and nothing of it elsewhere.
    pub kept: bool,
    /// Where in the registration the write sent to `WITHIN` was found (None: nowhere).
    pub landed_at: Option<usize>,
}

/// `LEN` bytes that cannot be mistaken for the background or for each other's shifts.
pub fn pattern(seed: u8) -> [u8; LEN] {
    std::array::from_fn(|i| (i as u8).wrapping_mul(7).wrapping_add(seed) | 0x80)
}

/// Where `pat` is found in `mem` (the first place).
pub fn find(mem: &[u8], pat: &[u8]) -> Option<usize> {
    mem.windows(pat.len()).position(|w| w == pat)
}

/// The verdict on the registration's bytes after the writes: the write sent to `WITHIN`
/// (`within`) is there and the bytes before it hold the background; the write sent to the
/// second page (`boundary`) landed, else the check says nothing (Err).
pub fn judge(mem: &[u8], within: &[u8; LEN], boundary: &[u8; LEN]) -> Result<Offsets, String> {
    if mem.get(PAGE..PAGE + LEN) != Some(&boundary[..]) {
        return Err(format!(
            "an on-demand RDMA WRITE of {LEN} bytes at a page boundary completed but is not in memory: the check cannot tell where writes land"
        ));
    }
    let landed_at = find(&mem[..PAGE], within);
    let kept = mem.get(WITHIN..WITHIN + LEN) == Some(&within[..])
        && mem[..WITHIN].iter().all(|&b| b == BACKGROUND);
    Ok(Offsets { kept, landed_at })
}

/// The check, on its own loopback queue pair `lb` (a failed write leaves it in error).
pub fn check(pd: &Pd, lb: &Loopback) -> Result<Offsets, String> {
    let dst = Buffer::new(2 * PAGE)?;
    // SAFETY: our own mapping of 2 * PAGE bytes, no registration of it yet.
    unsafe { std::ptr::write_bytes(dst.addr, BACKGROUND, 2 * PAGE) };
    let src = Buffer::new(PAGE)?;
    let (within, boundary) = (pattern(1), pattern(2));
    // SAFETY: within our mapping of PAGE bytes; 2 * LEN <= PAGE.
    unsafe {
        std::ptr::copy_nonoverlapping(within.as_ptr(), src.addr, LEN);
        std::ptr::copy_nonoverlapping(boundary.as_ptr(), src.at(LEN), LEN);
    }
    let src_mr = pd.reg(src.addr, PAGE, LOCAL_WRITE)?;
    let mr = match pd.reg(
        dst.addr,
        2 * PAGE,
        LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_ON_DEMAND,
    ) {
        Ok(mr) => mr,
        Err(e) => {
            pd.dereg(src_mr)?;
            return Err(e);
        }
    };
    let wrote = lb
        .write(src.addr, &src_mr, LEN, dst.at(WITHIN), &mr)
        .and_then(|()| lb.write(src.at(LEN), &src_mr, LEN, dst.at(PAGE), &mr));
    // The writes' completions were polled: the data is in memory (read before the
    // deregistration, as an application reads its buffer).
    // SAFETY: our own mapping of 2 * PAGE bytes, no longer written by the device.
    let mem = unsafe { std::slice::from_raw_parts(dst.addr, 2 * PAGE) }.to_vec();
    pd.dereg(mr)?;
    pd.dereg(src_mr)?;
    wrote.map_err(|e| format!("an on-demand RDMA WRITE failed: {e}"))?;
    judge(&mem, &within, &boundary)
}
