//! `Cache::refuse`, the one word `try_hit` reads for caching stopped, remote keys not kept
//! and verification on: what sets it, and that `try_hit` obeys it.

use super::test_fake::{Fake, LIMITS, idle_entry, req};
use super::*;

#[test]
fn the_refusal_word_follows_the_remote_mode_and_a_stop() {
    let fake = Fake::default();
    let keep = Cache::new(&fake, LIMITS);
    assert_eq!(keep.refuse.load(SeqCst), 0);
    for mode in [RemoteMode::Revoke, RemoteMode::Bypass] {
        let c = Cache::new(&fake, LIMITS).with_remote(mode);
        assert_eq!(c.refuse.load(SeqCst), access::REMOTE, "{mode:?}");
    }
    assert_eq!(refusal(RemoteMode::Keep, true), REFUSE_ALL);
    // A stop sets REFUSE_ALL for good; a fork child of a stopped cache has it too.
    let c = Cache::new(&fake, LIMITS).with_remote(RemoteMode::Revoke);
    assert!(c.stop_caching("test"));
    assert_eq!(c.refuse.load(SeqCst), access::REMOTE | REFUSE_ALL);
    let child = c.renewed(&fake);
    assert_eq!(child.refuse.load(SeqCst), access::REMOTE | REFUSE_ALL);
}

#[test]
fn try_hit_obeys_the_refusal_word() {
    let fake = Fake::default();
    let cache = Cache::new(&fake, LIMITS);
    let (_, ptr) = idle_entry(&cache, 0x10_0000);
    assert_eq!(cache.try_hit(&req(0x10_0000)), Some(ptr));
    assert_eq!(cache.try_release(ptr), Some(Released::Kept));
    // The entry is still indexed and idle: only the word refuses it.
    cache.refuse.store(REFUSE_ALL, SeqCst);
    assert_eq!(cache.try_hit(&req(0x10_0000)), None, "REFUSE_ALL");
    cache.refuse.store(access::REMOTE, SeqCst);
    assert_eq!(cache.try_hit(&req(0x10_0000)), Some(ptr), "a local request");
    assert_eq!(cache.try_release(ptr), Some(Released::Kept));
    let mut remote = req(0x20_0000);
    remote.access |= access::REMOTE_READ;
    cache.refuse.store(0, SeqCst);
    let (rptr, _) = cache.acquire(&remote).unwrap();
    assert_eq!(cache.release(rptr), Released::Kept);
    assert_eq!(cache.try_hit(&remote), Some(rptr));
    assert_eq!(cache.try_release(rptr), Some(Released::Kept));
    cache.refuse.store(access::REMOTE, SeqCst);
    assert_eq!(cache.try_hit(&remote), None, "a remote request");
}

/// `try_hit` does not call `classify`: a request it would refuse must still never be
/// served, because it matches no entry's key.
#[test]
fn try_hit_serves_no_request_classify_refuses() {
    let fake = Fake::default();
    let cache = Cache::new(&fake, LIMITS);
    let (_, ptr) = idle_entry(&cache, 0x10_0000);
    let a = req(0x10_0000);
    let refused = [
        Request {
            access: a.access | access::ON_DEMAND,
            ..a
        },
        Request {
            access: a.access | access::ZERO_BASED,
            ..a
        },
        Request {
            access: a.access | 1 << 15,
            ..a
        },
        Request { len: 0, ..a },
        Request {
            addr: usize::MAX - 0x10,
            ..a
        },
    ];
    for r in refused {
        assert!(access::classify(r.addr, r.len, r.access).is_err(), "{r:?}");
        assert_eq!(cache.try_hit(&r), None, "served {r:?}");
    }
    assert_eq!(cache.try_hit(&a), Some(ptr));
    assert_eq!(cache.try_release(ptr), Some(Released::Kept));
}
