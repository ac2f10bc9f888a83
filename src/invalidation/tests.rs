//! `InvalidationQueue` tests: order and overflow, concurrency, packing edges, fork.

mod basics {
    use super::super::*;

    fn drained(q: &InvalidationQueue) -> Vec<(usize, usize)> {
        let mut v = Vec::new();
        q.drain(|_, s, e| v.push((s, e)));
        v
    }

    #[test]
    fn inactive_queue_only_counts() {
        let q = InvalidationQueue::new();
        q.begin(0x1000, 0x2000);
        q.end();
        assert_eq!(q.quiet(), Some(1));
        assert!(drained(&q).is_empty());
    }

    #[test]
    fn ranges_come_back_in_order_and_overflow_merges() {
        let q = Box::new(InvalidationQueue::new());
        q.activate();
        for i in 0..CAPACITY + 10 {
            q.begin(i * 0x1000, i * 0x1000 + 0x100);
        }
        let v = drained(&q);
        assert_eq!(v.len(), CAPACITY + 1);
        assert_eq!(v[0], (0, 0x100));
        assert_eq!(
            v[CAPACITY - 1],
            ((CAPACITY - 1) * 0x1000, (CAPACITY - 1) * 0x1000 + 0x100)
        );
        // The overflow range covers the ten that did not fit, in 64 KiB units.
        assert_eq!(v[CAPACITY], (CAPACITY * 0x1000, 0x410000));
        assert!(!q.has_pending());
        // Reusable after a full cycle.
        q.begin(1, 2);
        assert_eq!(drained(&q), vec![(1, 2)]);
    }

    #[test]
    fn an_unrelated_hook_finishing_does_not_make_a_quiet_moment() {
        let q = InvalidationQueue::new();
        q.activate();
        // Held open: between its report and its system call.
        q.begin(0x10000, 0x20000);
        for _ in 0..100 {
            // Another thread's unmap begins and ends between the two loads.
            let quiet = q.quiet_with(|| {
                q.begin(0x100000, 0x110000);
                q.end();
            });
            assert_eq!(quiet, None, "quiet while an invalidation was in flight");
        }
        q.end();
        assert_eq!(q.quiet(), Some(101));
    }

    #[test]
    fn a_claimed_unfilled_slot_does_not_hide_the_ones_after_it() {
        let q = InvalidationQueue::new();
        q.activate();
        // A producer claimed slot 0 and was preempted before filling it.
        q.started.fetch_add(1, SeqCst);
        let claim = q.ring.claim().unwrap();
        // A later one filled slot 1 (and may have unmapped already).
        q.begin(0x5000, 0x6000);
        q.end();
        assert_eq!(drained(&q), vec![(0x5000, 0x6000)]);
        let mut numbered = Vec::new();
        q.drain(|n, s, e| numbered.push((n, s, e)));
        assert_eq!(
            numbered,
            vec![(None, 0x5000, 0x6000)],
            "seen again, not consumed"
        );
        // The first producer fills its slot: both are consumed, in order, with numbers.
        claim.fill([0, 0x1000, 0x2000]);
        numbered.clear();
        q.drain(|n, s, e| numbered.push((n, s, e)));
        assert_eq!(
            numbered,
            vec![(Some(0), 0x1000, 0x2000), (Some(1), 0x5000, 0x6000)]
        );
        assert!(!q.has_pending());
    }

    #[test]
    fn packed_overflow_ranges_cover_their_inputs() {
        use super::super::packed::*;
        let cases = [
            (0x1000usize, 0x2000usize),
            (0x10000, 0x20000),
            (0x7fff_ffff_0000, 0x7fff_ffff_f000),
            (0xffff, 0x10001),
        ];
        for &(s, e) in &cases {
            let (a, b) = unpack(pack(s, e));
            assert!(a <= s && e <= b, "{s:#x}..{e:#x} -> {a:#x}..{b:#x}");
        }
        let w = cases.iter().fold(EMPTY, |w, &(s, e)| merge(w, pack(s, e)));
        assert_eq!(unpack(w), (0, 0x8000_0000_0000));
        assert_eq!(unpack(pack(0x1000, usize::MAX)), (0, usize::MAX));
        assert_eq!(
            unpack(merge(pack(0, 0x1000), pack(0x1000, usize::MAX))),
            (0, usize::MAX)
        );
    }

    #[test]
    fn concurrent_producers_lose_nothing() {
        let q = Box::new(InvalidationQueue::new());
        q.activate();
        let total = std::sync::atomic::AtomicUsize::new(0);
        let covered = std::sync::Mutex::new(vec![false; 4 * 5000]);
        std::thread::scope(|s| {
            for t in 0..4 {
                let q = &q;
                s.spawn(move || {
                    for i in 0..5000 {
                        let k = t * 5000 + i;
                        q.begin(k, k + 1);
                        q.end();
                    }
                });
            }
            s.spawn(|| {
                for _ in 0..2000 {
                    q.drain(|_, a, b| {
                        total.fetch_add(1, Relaxed);
                        let mut c = covered.lock().unwrap();
                        for k in a..b.min(c.len()) {
                            c[k] = true;
                        }
                    });
                }
            });
        });
        q.drain(|_, a, b| {
            let mut c = covered.lock().unwrap();
            for k in a..b.min(c.len()) {
                c[k] = true;
            }
        });
        assert!(
            covered.lock().unwrap().iter().all(|&c| c),
            "an invalidation was lost"
        );
        assert_eq!(q.quiet(), Some(20000));
    }
}

mod overflow_stress {
    use super::super::*;
    use std::sync::atomic::AtomicBool;

    /// Marks [a, b) (in units) in a bitset, a word at a time for long runs.
    fn mark(bits: &mut [u64], a: usize, b: usize) {
        let b = b.min(bits.len() * 64);
        let mut k = a;
        while k < b {
            if k % 64 == 0 && k + 64 <= b {
                bits[k / 64] = u64::MAX;
                k += 64;
            } else {
                bits[k / 64] |= 1 << (k % 64);
                k += 1;
            }
        }
    }

    /// One producer pushing one-page ranges as fast as it can, a drainer that works a little
    /// on every range (so the ring overflows again and again), two threads making noise:
    /// every range pushed must come back covered. An overflow range of three words lost
    /// some this way (29 and 50 of 60 million in two runs) when a merge and a drain
    /// interleaved.
    #[test]
    fn overflow_never_loses_a_range() {
        const PAGE: usize = 4096;
        let pushes: usize = if cfg!(debug_assertions) {
            2_000_000
        } else {
            60_000_000
        };
        let q = Box::new(InvalidationQueue::new());
        q.activate();
        let done = AtomicBool::new(false);
        let mut bits = vec![0u64; pushes.div_ceil(64)];
        std::thread::scope(|s| {
            let (q, done) = (&q, &done);
            s.spawn(move || {
                for k in 0..pushes {
                    q.begin(k * PAGE, (k + 1) * PAGE);
                    q.end();
                }
                done.store(true, SeqCst);
            });
            for _ in 0..2 {
                s.spawn(move || {
                    let mut x = 0u64;
                    while !done.load(Relaxed) {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                        std::hint::black_box(x);
                    }
                });
            }
            let bits = &mut bits;
            s.spawn(move || {
                let mut sink = 0u64;
                loop {
                    let finished = done.load(SeqCst);
                    q.drain(|_, a, b| {
                        for i in 0..50u64 {
                            sink = std::hint::black_box(sink.wrapping_add(i));
                        }
                        mark(bits, a / PAGE, b.div_ceil(PAGE));
                    });
                    if finished {
                        break;
                    }
                }
            });
        });
        let uncovered = (0..pushes)
            .filter(|&k| bits[k / 64] & (1 << (k % 64)) == 0)
            .count();
        assert_eq!(
            uncovered, 0,
            "{uncovered} of {pushes} invalidated ranges were never drained"
        );
    }
}

mod edge_cases {
    use super::super::*;

    /// Packing: every range (including unit edges, ranges ending at 2^47, beyond, usize::MAX)
    /// unpacks to a superset, and merges cover both inputs.
    #[test]
    fn packing_edges_cover() {
        use super::super::packed::*;
        let lim = 1usize << 47;
        let u = 1usize << 16;
        let mut pts = vec![
            0usize,
            1,
            4095,
            4096,
            u - 1,
            u,
            u + 1,
            2 * u - 1,
            2 * u,
            lim - u - 1,
            lim - u,
            lim - u + 1,
            lim - 4096,
            lim - 1,
            lim,
            lim + 1,
            lim + u,
            usize::MAX - 1,
            usize::MAX,
        ];
        let mut x = 0x9e3779b97f4a7c15u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            pts.push((x as usize) % (lim + 2 * u));
        }
        let ranges: Vec<(usize, usize)> = pts
            .iter()
            .flat_map(|&a| pts.iter().take(40).map(move |&b| (a.min(b), a.max(b))))
            .filter(|&(s, e)| e > s)
            .collect();
        for &(s, e) in &ranges {
            let (a, b) = unpack(pack(s, e));
            assert!(a <= s && e <= b, "{s:#x}..{e:#x} -> {a:#x}..{b:#x}");
        }
        for w in ranges.windows(2) {
            let m = unpack(merge(pack(w[0].0, w[0].1), pack(w[1].0, w[1].1)));
            for &(s, e) in w {
                assert!(m.0 <= s && e <= m.1, "merge lost {s:#x}..{e:#x}: {m:?}");
            }
        }
        println!("checked {} ranges", ranges.len());
    }

    /// A hook in the forking thread (fork called from a signal handler that interrupted
    /// the hook between begin and end; _Fork is async-signal-safe): in the child,
    /// reset_after_fork sets finished = started, then the interrupted hook's end() makes
    /// finished = started + 1, so the next invalidation in flight reads as quiet.
    #[test]
    fn signal_fork_mid_hook_stays_in_flight_in_the_child() {
        let q = InvalidationQueue::new();
        q.activate();
        q.begin(0x1000, 0x2000); // the hook; signal arrives during its syscall
        q.reset_after_fork(1); // handler forks; child handler runs (one hook open here)
        q.end(); // handler returns in the child; the hook finishes
        q.begin(0x10_0000, 0x20_0000); // another unmap, in flight (before its syscall)
        assert_eq!(
            q.quiet(),
            None,
            "quiet() reports no invalidation in flight while one is"
        );
    }

    /// Same, but the signal lands between the producer's tail CAS and its seq store: in
    /// the child the slot gets a seq from the parent's lap and the ring wedges: push spins.
    #[test]
    fn signal_fork_mid_push_does_not_wedge_the_ring() {
        let q: &'static InvalidationQueue = Box::leak(Box::new(InvalidationQueue::new()));
        q.activate();
        for i in 0..5 {
            q.begin(i * 0x1000, i * 0x1000 + 0x1000);
            q.end();
        }
        let mut n = 0;
        q.drain(|_, _, _| n += 1);
        assert_eq!(n, 5);
        // The hook: begin counted and claimed slot 5, then the signal.
        q.started.fetch_add(1, SeqCst);
        let claim = q.ring.claim().unwrap();
        q.reset_after_fork(1);
        // Back from the handler in the child: the push completes.
        claim.fill([5, 0x5000, 0x6000]);
        q.end();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for i in 0..8 {
                q.begin(0x10_0000 + i * 0x1000, 0x10_1000 + i * 0x1000);
                q.end();
            }
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(std::time::Duration::from_secs(2)).is_ok(),
            "a memory hook in the child spins forever in push"
        );
    }

    /// A producer that stalls between claim and fill while another pushes and a drainer
    /// consumes and peeks: every range handed out is one that was pushed (no torn or
    /// reused slot read during a peek) and every range is covered.
    #[test]
    fn stalled_producer_peeks_are_consistent() {
        use std::sync::atomic::AtomicUsize as AU;
        const PAGE: usize = 4096;
        const MAXID: usize = 1 << 22;
        let q: &'static InvalidationQueue = Box::leak(Box::new(InvalidationQueue::new()));
        q.activate();
        let stop = AtomicBool::new(false);
        let all_done = AtomicBool::new(false);
        let drains = AU::new(0);
        let next_id = AU::new(0);
        let mut bits = vec![false; MAXID];
        let (mut bad, mut peeks) = (0usize, 0usize);
        std::thread::scope(|s| {
            let (stop, all_done, drains, next_id) = (&stop, &all_done, &drains, &next_id);
            // The staller: claims a slot, waits for two drains, fills it.
            s.spawn(move || {
                for _ in 0..200 {
                    let id = next_id.fetch_add(1, SeqCst);
                    let number = q.started.fetch_add(1, SeqCst);
                    if let Some(claim) = q.ring.claim() {
                        while q.ring.tail() < claim.pos() + 10 {
                            std::thread::yield_now();
                        }
                        let d0 = drains.load(SeqCst);
                        while drains.load(SeqCst) < d0 + 2 {
                            std::thread::yield_now();
                        }
                        claim.fill([number, (id * PAGE) as u64, (id * PAGE + PAGE) as u64]);
                    } else {
                        let mine = packed::pack(id * PAGE, id * PAGE + PAGE);
                        let _ = q
                            .overflow
                            .fetch_update(SeqCst, SeqCst, |w| Some(packed::merge(w, mine)));
                    }
                    q.end();
                }
                stop.store(true, SeqCst);
            });
            s.spawn(move || {
                while !stop.load(SeqCst) {
                    let id = next_id.fetch_add(1, SeqCst);
                    assert!(id < MAXID);
                    q.begin(id * PAGE, id * PAGE + PAGE);
                    q.end();
                }
                all_done.store(true, SeqCst);
            });
            let bits = &mut bits;
            let (bad, peeks) = (&mut bad, &mut peeks);
            s.spawn(move || {
                loop {
                    let fin = all_done.load(SeqCst);
                    q.drain(|n, a, b| {
                        let page = b - a == PAGE && a % PAGE == 0;
                        match n {
                            Some(_) if !page => *bad += 1,
                            None if page => *peeks += 1,
                            None if a % (1 << 16) != 0 || b % (1 << 16) != 0 => *bad += 1,
                            _ => {}
                        }
                        let lo = a / PAGE;
                        let hi = b.div_ceil(PAGE).min(bits.len());
                        for x in bits.iter_mut().take(hi).skip(lo) {
                            *x = true;
                        }
                    });
                    drains.fetch_add(1, SeqCst);
                    if fin {
                        break;
                    }
                }
            });
        });
        let n = next_id.load(SeqCst);
        let uncovered = bits[..n].iter().filter(|&&b| !b).count();
        eprintln!("{n} ranges, peeked {peeks}; bad {bad}; uncovered {uncovered}");
        // How many ranges were peeked depends on timing (with the ring full they overflow
        // instead); what must hold is that none is torn and none uncovered.
        assert_eq!((bad, uncovered), (0, 0));
    }
}
