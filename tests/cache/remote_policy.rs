//! `MRCACHE_REMOTE` in the core, against a fake HCA whose remote keys are checked like a
//! device would: a key reaches memory only while it is live. The cached registration itself
//! must never carry a live remote key in `revoke` mode; each handle gets a fresh one, dead
//! before `release` returns. `keep` shows the old behaviour (the key outlives the release).

use mrcache::access::{LOCAL_WRITE, REMOTE_WRITE};
use mrcache::cache::{
    AcquireError, Cache, Limits, Mr, Outcome, Registrar, Released, Request, UNSUPPORTED,
};
use mrcache::config::RemoteMode;
use mrcache::stats::Counter;
use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Default)]
struct Hca {
    windows: bool,
    state: Mutex<HcaState>,
}

#[derive(Default)]
struct HcaState {
    next: usize,
    /// MR pointer -> (access it was registered with, its own rkey).
    mrs: HashMap<usize, (u32, u32)>,
    /// Handle -> its window key.
    grants: HashMap<usize, u32>,
    /// Keys that reach memory now.
    live_keys: Vec<u32>,
    spare: Vec<usize>,
}

impl Hca {
    fn live(&self, key: u32) -> bool {
        self.state.lock().unwrap().live_keys.contains(&key)
    }
    /// The rkey the app would read from the handle.
    fn rkey(&self, handle: usize) -> u32 {
        let st = self.state.lock().unwrap();
        st.grants
            .get(&handle)
            .copied()
            .or_else(|| st.mrs.get(&handle).map(|m| m.1))
            .unwrap()
    }
}

impl Registrar for Hca {
    fn register(&self, req: &Request) -> Result<Mr, i32> {
        let mut st = self.state.lock().unwrap();
        st.next += 1;
        let ptr = 0x1000 * st.next;
        let key = st.next as u32;
        if req.access & REMOTE_WRITE != 0 {
            st.live_keys.push(key);
        }
        st.mrs.insert(ptr, (req.access, key));
        Ok(Mr {
            ptr,
            via_wrapper: false,
        })
    }
    fn deregister(&self, mr: Mr) -> Result<(), i32> {
        let mut st = self.state.lock().unwrap();
        let (_, key) = st.mrs.remove(&mr.ptr).unwrap();
        st.live_keys.retain(|&k| k != key);
        Ok(())
    }
    fn alloc_shadow(&self) -> Option<usize> {
        let mut st = self.state.lock().unwrap();
        st.next += 1;
        Some(0x1000 * st.next)
    }
    fn fill_shadow(&self, _slot: usize, _mr: Mr, _addr: usize, _len: usize) -> bool {
        true
    }
    fn register_revocable(&self, req: &Request) -> Result<Mr, i32> {
        if !self.windows {
            return Err(UNSUPPORTED);
        }
        self.register(&Request {
            access: req.access & !REMOTE_WRITE,
            ..*req
        })
    }
    fn grant(&self, mr: Mr, _req: &Request) -> Result<usize, i32> {
        let mut st = self.state.lock().unwrap();
        assert_eq!(
            st.mrs[&mr.ptr].0 & REMOTE_WRITE,
            0,
            "a revocable MR has remote rights"
        );
        st.next += 1;
        let key = 0x100_0000 + st.next as u32;
        let h = st.spare.pop().unwrap_or(0x1000 * st.next);
        st.grants.insert(h, key);
        st.live_keys.push(key);
        Ok(h)
    }
    fn revoke(&self, handle: usize) -> Result<(), i32> {
        let mut st = self.state.lock().unwrap();
        let key = st.grants.remove(&handle).unwrap();
        st.live_keys.retain(|&k| k != key);
        st.spare.push(handle);
        Ok(())
    }
    fn recycle_grant(&self, handle: usize) {
        self.state.lock().unwrap().spare.push(handle);
    }
}

const LIMITS: Limits = Limits {
    max_entries: 16,
    max_bytes: 1 << 30,
    shadow: true,
    remote_superset: false,
};

fn req(access: u32) -> Request {
    Request {
        pd: 1,
        context: 1,
        addr: 0x10_0000,
        len: 16 << 10,
        iova: 0x10_0000,
        access,
    }
}

/// A cache under `MRCACHE_REMOTE=revoke` on an HCA with memory windows.
fn revoking() -> Cache<Hca> {
    let hca = Hca {
        windows: true,
        ..Hca::default()
    };
    Cache::new(hca, LIMITS).with_remote(RemoteMode::Revoke)
}

#[test]
fn revoke_kills_the_key_at_release_and_a_hit_gets_a_fresh_one() {
    let cache = revoking();
    let r = req(LOCAL_WRITE | REMOTE_WRITE);
    let (h1, o) = cache.acquire(&r).unwrap();
    assert_eq!(o, Outcome::Miss);
    let k1 = cache.registrar().rkey(h1);
    assert!(cache.registrar().live(k1));
    assert_eq!(cache.release(h1), Released::Kept);
    assert!(!cache.registrar().live(k1), "the key outlived ibv_dereg_mr");
    let (h2, o) = cache.acquire(&r).unwrap();
    assert_eq!(o, Outcome::Hit);
    let k2 = cache.registrar().rkey(h2);
    assert_ne!(k1, k2, "a hit handed out the key from before");
    assert!(cache.registrar().live(k2) && !cache.registrar().live(k1));
    // Two holders at once: two keys, each dead at its own release.
    let (h3, _) = cache.acquire(&r).unwrap();
    let k3 = cache.registrar().rkey(h3);
    assert_ne!(k3, k2);
    assert_eq!(cache.release(h2), Released::Kept);
    assert!(!cache.registrar().live(k2) && cache.registrar().live(k3));
    assert_eq!(cache.release(h3), Released::Kept);
    assert_eq!(cache.release(h3), Released::DoubleRelease);
    let s = cache.snapshot().counts;
    assert_eq!(
        (
            s[Counter::RemoteGrants],
            s[Counter::RemoteRevokes],
            s[Counter::Hits],
            s[Counter::Misses]
        ),
        (3, 3, 2, 1)
    );
    // No key at all reaches the idle entry's memory.
    assert!(cache.registrar().state.lock().unwrap().live_keys.is_empty());
    // Local-only registrations are untouched: the provider's own pointer.
    let (l, o) = cache.acquire(&req(LOCAL_WRITE)).unwrap();
    assert_eq!(o, Outcome::Miss);
    assert!(cache.registrar().state.lock().unwrap().mrs.contains_key(&l));
    assert_eq!(cache.flush_all(), 1);
}

#[test]
fn keep_leaves_the_key_alive_on_purpose() {
    let cache = Cache::new(Hca::default(), LIMITS).with_remote(RemoteMode::Keep);
    let r = req(LOCAL_WRITE | REMOTE_WRITE);
    let (h1, _) = cache.acquire(&r).unwrap();
    let k1 = cache.registrar().rkey(h1);
    assert_eq!(cache.release(h1), Released::Kept);
    assert!(
        cache.registrar().live(k1),
        "keep: the key stays live while cached"
    );
}

#[test]
fn bypass_and_devices_without_windows_pass_remote_requests_through() {
    let cache = Cache::new(Hca::default(), LIMITS).with_remote(RemoteMode::Bypass);
    let remote = req(LOCAL_WRITE | REMOTE_WRITE);
    assert!(matches!(
        cache.acquire(&remote),
        Err(AcquireError::Bypass {
            why: mrcache::access::Bypass::Remote,
            ..
        })
    ));
    let no_windows = Cache::new(Hca::default(), LIMITS).with_remote(RemoteMode::Revoke);
    assert!(matches!(
        no_windows.acquire(&remote),
        Err(AcquireError::Bypass {
            why: mrcache::access::Bypass::Remote,
            ..
        })
    ));
    assert!(no_windows.registrar().state.lock().unwrap().mrs.is_empty());
    assert_eq!(
        no_windows.acquire(&req(LOCAL_WRITE)).unwrap().1,
        Outcome::Miss
    );
}

/// `ibv_rereg_mr` of the app's only handle: the entry is
/// reserved while the provider is asked. Refused: `abort_sole` leaves everything as it was
/// (the handle's key live, the entry hit again, the handle released as before); refused
/// after the memory went away meanwhile: the entry stays dead and goes at the release.
/// Done: `commit_sole` makes the handle an alias whose release deregisters the MR and
/// recycles the handle, and the revoke is counted.
#[test]
fn a_reserved_sole_handle_is_as_it_was_after_a_refused_rereg() {
    let cache = revoking();
    let r = req(LOCAL_WRITE | REMOTE_WRITE);
    let (h, _) = cache.acquire(&r).unwrap();
    let k = cache.registrar().rkey(h);
    let g = cache
        .reserve_sole(h, r.addr, r.len)
        .expect("the only handle");
    assert_eq!(g.access, r.access, "the handle's own rights");
    assert!(
        cache.reserve_sole(h, r.addr, r.len).is_none(),
        "reserved twice"
    );
    // Meanwhile another registration of the range cannot take the reserved entry (it is
    // registered afresh or passed to libibverbs).
    if let Ok((other, o)) = cache.acquire(&r) {
        assert_ne!(o, Outcome::Hit, "a hit on a reserved entry");
        cache.release(other);
    }
    cache.abort_sole(h, g);
    assert!(cache.registrar().live(k), "a refused rereg revoked the key");
    assert_eq!(cache.release(h), Released::Kept);
    let (h2, o) = cache.acquire(&r).unwrap();
    assert_eq!(
        o,
        Outcome::Hit,
        "the entry is not live again after the refusal"
    );

    // Refused, the memory invalidated while the provider was asked: dead for good.
    let g = cache.reserve_sole(h2, r.addr, r.len).unwrap();
    cache.invalidate(r.addr, r.addr + r.len);
    cache.abort_sole(h2, g);
    assert_eq!(
        cache.release(h2),
        Released::Deregistered,
        "revived a dead entry"
    );

    // Done: the alias.
    let (h3, o) = cache.acquire(&r).unwrap();
    assert_eq!(o, Outcome::Miss);
    let g = cache.reserve_sole(h3, r.addr, r.len).unwrap();
    // The preload revokes the window only (the handle is the app's until its release).
    {
        let mut st = cache.registrar().state.lock().unwrap();
        let key = st.grants.remove(&h3).unwrap();
        st.live_keys.retain(|&k| k != key);
    }
    cache.commit_sole(h3, g);
    let mrs = cache.registrar().state.lock().unwrap().mrs.len();
    assert_eq!(cache.release(h3), Released::Deregistered);
    assert_eq!(cache.registrar().state.lock().unwrap().mrs.len(), mrs - 1);
    assert_eq!(cache.release(h3), Released::DoubleRelease);
    let (h4, _) = cache.acquire(&r).unwrap();
    assert_eq!(h4, h3, "the alias's handle was not recycled");
    let s = cache.snapshot().counts;
    assert_eq!(
        s[Counter::RemoteGrants],
        s[Counter::RemoteRevokes] + 1,
        "the sole rereg's revoke is not counted"
    );
}

/// While `ibv_rereg_mr` has an entry reserved (dead, still indexed), a registration of its
/// key takes the miss path as before: a remote one under revoke is passed to libibverbs as
/// a remote pass-through, a local one is registered and handed out uncached. Neither is
/// `references-full`, which only a live entry held 4,095 times is (both
/// were reported so when every failed claim on an exact hit was taken for a full one).
#[test]
fn a_registration_while_its_entry_is_reserved_for_a_rereg_takes_the_miss_path() {
    let cache = revoking();
    let r = req(LOCAL_WRITE | REMOTE_WRITE);
    let (h, _) = cache.acquire(&r).unwrap();
    let g = cache.reserve_sole(h, r.addr, r.len).unwrap();
    let got = cache.acquire(&r);
    assert!(
        matches!(
            got,
            Err(AcquireError::Bypass {
                why: mrcache::access::Bypass::Remote,
                ..
            })
        ),
        "remote, during the rereg: {got:?}"
    );
    cache.abort_sole(h, g);

    let cache = Cache::new(Hca::default(), LIMITS);
    let r = req(LOCAL_WRITE);
    let (p, _) = cache.acquire(&r).unwrap();
    let (s, _) = cache.acquire(&r).unwrap();
    assert_ne!(p, s, "the second holding is a shadow");
    cache.release(p);
    let g = cache.reserve_sole(s, r.addr, r.len).unwrap();
    let got = cache.acquire(&r);
    assert!(
        matches!(got, Ok((_, Outcome::Uncached))),
        "local, during the rereg: {got:?}"
    );
    cache.release(got.unwrap().0);
    cache.abort_sole(s, g);
}
