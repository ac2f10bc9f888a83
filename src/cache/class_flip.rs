//! A local class's flip to pass-through evicts that class's idle
//! entries, and looks at those only, not at every entry of the cache (`evict_idle` over
//! all of them takes 2-4 ms at 16k entries, under the cache lock).

use super::*;

use super::test_fake::{Fake, LIMITS};

fn req(addr: usize, len: usize, access: u32) -> Request {
    Request {
        pd: 0x10,
        context: 0x20,
        addr,
        len,
        iova: addr as u64,
        access,
    }
}

/// Cache `r` and leave it idle: its provider pointer.
fn idle(cache: &Cache<&Fake>, r: &Request) -> usize {
    let (h, _) = cache.acquire(r).unwrap();
    assert_eq!(cache.release(h), Released::Kept);
    h
}

/// Injected figures for `len`'s local class: a miss of `miss` ns each way, a round of
/// `round` ns.
fn set_figures(cache: &Cache<&Fake>, len: usize, miss: f64, round: f64) {
    cache.figures(Access::Local, len, |f| {
        let m = |v: f64| admission::Mean {
            value: v,
            samples: 100,
        };
        (f.reg, f.dereg, f.pass_reg, f.pass_dereg) = (m(miss), m(miss), m(miss), m(miss));
        (f.round, f.hit, f.release) = (m(round), m(round), m(round));
    });
}

/// Figures that make caching `len`'s local class pay (whatever the fake's registrations
/// measured), then not: a miss of 2 ns, a round of 1 ms. The flip.
fn flip_to_pass_through(cache: &Cache<&Fake>, len: usize) {
    set_figures(cache, len, 1e6, 1.0);
    cache.lock().examined = 0;
    set_figures(cache, len, 1.0, 1e6);
}

fn flip_examines_only_its_class(remote: RemoteMode) {
    let fake = Fake::default();
    // Filled under `always` (the fake's free registrations would pass every class through),
    // then admission on, as if the figures had made every class pay so far.
    let mut cache = Cache::new(&fake, LIMITS).with_remote(remote);
    const MANY: usize = 4000;
    let mut other = Vec::new();
    for i in 0..MANY {
        other.push(idle(&cache, &req(0x100_0000 + i * 0x2000, 0x1000, 1)));
    }
    // The class that flips: 8 local 64 KiB entries, and under keep 4 with remote rights
    // (local kind there; under revoke they would be revocable, which this fake is not).
    let mut class = Vec::new();
    for i in 0..8 {
        class.push(idle(&cache, &req(0x4000_0000 + i * 0x20000, 0x10000, 1)));
    }
    let mut remote_ones = Vec::new();
    for i in 0..if remote == RemoteMode::Revoke { 0 } else { 4 } {
        let r = req(0x5000_0000 + i * 0x20000, 0x10000, 1 | access::REMOTE);
        remote_ones.push(idle(&cache, &r));
    }
    let local_kind = if remote == RemoteMode::Revoke { 8 } else { 12 };
    cache.admit = Admit::Auto;
    fake.deregistered.lock().unwrap().clear();
    cache.lock().examined = 0;
    flip_to_pass_through(&cache, 0x10000);
    let examined = cache.lock().examined;
    let gone = fake.deregistered.lock().unwrap().clone();
    println!(
        "{remote:?}: the flip looked at {examined} entries, deregistered {} ({} entries cached)",
        gone.len(),
        MANY + local_kind
    );
    let mut want: Vec<usize> = class.clone();
    if remote != RemoteMode::Revoke {
        want.extend(&remote_ones);
    }
    let mut got = gone.clone();
    got.sort();
    want.sort();
    assert_eq!(
        got, want,
        "{remote:?}: the flip deregistered the wrong entries"
    );
    assert_eq!(
        examined, local_kind,
        "{remote:?}: a flip of a class of {local_kind} entries looked at {examined} entries"
    );
    // The other class is intact: every one of its entries still hits.
    for (i, &h) in other.iter().enumerate().step_by(499) {
        let (again, o) = cache
            .acquire(&req(0x100_0000 + i * 0x2000, 0x1000, 1))
            .unwrap();
        assert_eq!((again, o), (h, Outcome::Hit));
        cache.release(again);
    }
}

#[test]
fn local_flip_examines_only_its_class_under_keep() {
    flip_examines_only_its_class(RemoteMode::Keep);
}

#[test]
fn local_flip_examines_only_its_class_under_revoke() {
    flip_examines_only_its_class(RemoteMode::Revoke);
}

/// The class lists stay right through removals in any order: after entries leave from the
/// head, the middle and the tail, a flip still finds exactly the ones left.
#[test]
fn class_lists_survive_removals() {
    let fake = Fake::default();
    let mut cache = Cache::new(&fake, LIMITS);
    let reqs: Vec<Request> = (0..10)
        .map(|i| req(0x4000_0000 + i * 0x20000, 0x10000, 1))
        .collect();
    let ptrs: Vec<usize> = reqs.iter().map(|r| idle(&cache, r)).collect();
    // Evict 0 (the tail: the list is newest first), 9 (the head) and 4 (the middle).
    for k in [0usize, 9, 4] {
        let mut st = cache.lock();
        let id = cache.fast.by_mr(ptrs[k]).unwrap();
        assert!(cache.fast.slots.get(id).unwrap().kill_if_idle());
        st.remove(&cache.fast, id);
    }
    cache.admit = Admit::Auto;
    fake.deregistered.lock().unwrap().clear();
    cache.lock().examined = 0;
    flip_to_pass_through(&cache, 0x10000);
    let mut got = fake.deregistered.lock().unwrap().clone();
    got.sort();
    let want: Vec<usize> = [1, 2, 3, 5, 6, 7, 8].iter().map(|&k| ptrs[k]).collect();
    assert_eq!(got, want);
    assert_eq!(cache.lock().examined, 7);
}
