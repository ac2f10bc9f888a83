#!/usr/bin/env python3
"""Reads the output of ci/bench's runs and prints the tables (and writes gnuplot data).

    ci/bench-report.py SECTION ARGS...

Sections: regmr FILE DAT | unmap DAT LABEL=FILE... | selftest FILE | evict FILE |
remote FILE | riostream STATS_DIR FILE... . A section whose runs are missing or failed says
so and goes on: the benchmarks are never pass/fail.
"""
import glob
import json
import os
import re
import statistics
import sys


def median(xs):
    return statistics.median(xs) if xs else None


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def regmr(path, dat_path):
    """Lines 'plain|preload BENCH size= ...', alternating runs; the median per size."""
    pat = r"^(plain|preload) BENCH size=(\d+) iters=\d+ ns_per_pair=(\S+) regs_per_s=(\S+)"
    d = {"plain": {}, "preload": {}}
    for m in re.finditer(pat, read(path), re.M):
        d[m[1]].setdefault(int(m[2]), []).append(float(m[4]))
    sizes = sorted(set(d["plain"]) & set(d["preload"]))
    if not sizes:
        print("regmr: no figures (the runs failed?)")
        return
    print(f"{'buffer':>10} {'no cache reg/s':>15} {'mrcache reg/s':>15} {'ratio':>8}  runs"
          "   (reg+dereg of one buffer, rxe under TCG; median)")
    with open(dat_path, "w") as dat:
        for size in sizes:
            a, b = median(d["plain"][size]), median(d["preload"][size])
            print(f"{size // 1024:>8}Ki {a:>15,.0f} {b:>15,.0f} {b / a:>7.2f}x  {len(d['plain'][size])}")
            dat.write(f"{size // 1024} {b / a:.2f}\n")


def unmap(dat_path, *labelled):
    """Lines 'plain|preload BENCH unmap op= mode= ...' from each FILE, per LABEL."""
    pat = (r"^(plain|preload) BENCH unmap op=(\S+) mode=(\S+)(?: device=\S+)? iters=\d+ "
           r"median_call_ns=(\d+) median_iter_ns=(\d+)")
    print("call: the median call of each run; iteration: the median of mmap, touch, [reg, dereg,]")
    print("call [, munmap], where a held range pays its deferred deregistration; median of the runs")
    print(f"{'where':<8} {'memory':<7} {'call':<8} {'without':>9} {'with':>9} {'ratio':>7}"
          f"   {'iteration without':>17} {'with':>9} {'ratio':>7}  runs")
    rows = []
    for arg in labelled:
        label, path = arg.split("=", 1)
        d = {}
        for m in re.finditer(pat, read(path), re.M):
            d.setdefault((m[2], m[3]), {"plain": [], "preload": []})[m[1]].append(
                (float(m[4]), float(m[5])))
        for (op, mode), v in d.items():
            if not v["plain"] or not v["preload"]:
                continue
            a = median([c for c, _ in v["plain"]])
            b = median([c for c, _ in v["preload"]])
            ia = median([i for _, i in v["plain"]])
            ib = median([i for _, i in v["preload"]])
            print(f"{label:<8} {mode:<7} {op:<8} {a:>7,.0f}ns {b:>7,.0f}ns {b / a:>6.2f}x"
                  f"   {ia:>15,.0f}ns {ib:>7,.0f}ns {ib / ia:>6.2f}x  {len(v['plain'])}")
            rows.append((op, f"{label} {mode}", b / a))
    if not rows:
        print("unmap: no figures (the runs failed?)")
        return
    # gnuplot: one row per call, one column per (where, memory), the ratio.
    order = ["idle", "active", "held"]
    cols = sorted({c for _, c, _ in rows},
                  key=lambda c: (not c.startswith("host"), order.index(c.split()[-1])))
    with open(dat_path, "w") as dat:
        dat.write("call " + " ".join(f'"{c}"' for c in cols) + "\n")
        for op in ("munmap", "madvise", "mremap"):
            vals = {c: r for o, c, r in rows if o == op}
            dat.write(op + " " + " ".join(f"{vals[c]:.3f}" if c in vals else "-" for c in cols) + "\n")


def selftest(path):
    us = [int(m[1]) for m in re.finditer(r"self-test .* in (\d+) us", read(path))]
    if us:
        print(f"startup self-test (at the first registration, in the VM): {median(us):,.0f} us"
              f" (median of {len(us)})")


def evict(path):
    pat = r"^(plain|small|fits) BENCH evict buffers=\d+ iters=\d+ ns_per_pair=\d+ pairs_per_s=(\d+)"
    d = {}
    for m in re.finditer(pat, read(path), re.M):
        d.setdefault(m[1], []).append(float(m[2]))
    if "plain" not in d:
        print("evict: no figures (the runs failed?)")
        return
    base = median(d["plain"])
    for k, label in (("plain", "libibverbs alone"),
                     ("small", "preload, MRCACHE_MAX_ENTRIES=32 (evicts every call)"),
                     ("fits", "preload, MRCACHE_MAX_ENTRIES=128 (all hits)")):
        if k in d:
            v = median(d[k])
            print(f"{label:<52} {v:>10,.0f}/s {v / base:>6.2f}x")


def remote(path):
    text = read(path)
    for line in text.splitlines():
        if line.startswith("CHECK"):
            print(line)
    pat = r"BENCH mode=(\S+) size=\d+ iters=\d+ ns_per_pair=\d+ pairs_per_s=(\d+)"
    d = {}
    for m in re.finditer(pat, text):
        d.setdefault(m[1], []).append(float(m[2]))
    if "plain" not in d:
        print("remote: no figures (the runs failed?)")
        return
    base = median(d["plain"])
    labels = {"plain": "libibverbs alone", "mw1": "raw type-1 bind+unbind",
              "mw2": "raw type-2 bind+local-inv", "revoke": "preload, MRCACHE_REMOTE=revoke",
              "keep": "preload, MRCACHE_REMOTE=keep", "bypass": "preload, MRCACHE_REMOTE=bypass"}
    for k, label in labels.items():
        if k in d:
            v = median(d[k])
            print(f"{label:<34} {v:>10,.0f}/s {v / base:>6.1f}x")


def riostream(stats_dir, *paths):
    """Each FILE: a line 'RIO size= mode= round=' and the pair's output (client| lines)."""
    runs = {}
    failed = 0
    for path in paths:
        text = read(path)
        m = re.search(r"^RIO size=(\d+) mode=(\S+) round=(\d+)", text, re.M)
        if not m:
            continue
        perf = re.search(r"^client\| custom\s+\S+\s+\S+\s+\S+\s+\S+\s+(\S+)s\s+(\S+)\s+(\S+)",
                         text, re.M)
        wall = re.search(r"^client\| WALL (\d+)", text, re.M)
        if not perf or not wall or "client exit 0, server exit 0" not in text:
            failed += 1
            continue
        runs.setdefault((int(m[1]), m[2]), []).append(
            (float(perf[3]), float(perf[2]), int(wall[1]) / 1e6))
    if failed:
        print(f"riostream: {failed} run(s) failed or printed no figures (left out)")
    if not runs:
        print("riostream: no figures")
        return
    modes = [("plain", "libibverbs"), ("revoke", "preload, revoke"), ("keep", "preload, keep")]
    print("riostream: client and server in the guest over rxe0, one connection, one riomap'd")
    print("buffer; usec/xfer is riostream's own figure (timed loop only), wall the client process")
    print("from exec to exit (rdma_cm connect and the registrations included); median of the runs")
    head = (f"{'size':>8} {'mode':<15} {'usec/xfer':>10} {'(min-max)':>17} {'Gb/s':>6} {'ratio':>6}"
            f" {'wall s':>7} {'ratio':>6}  runs")
    print(head)
    for size in sorted({s for s, _ in runs}):
        base = runs.get((size, "plain"))
        bx = median([x for x, _, _ in base]) if base else None
        bw = median([w for _, _, w in base]) if base else None
        for mode, label in modes:
            r = runs.get((size, mode))
            if not r:
                continue
            x, g, w = (median([t[i] for t in r]) for i in range(3))
            rx = f"{x / bx:>5.2f}x" if bx else "     -"
            rw = f"{w / bw:>5.2f}x" if bw else "     -"
            lo, hi = min(t[0] for t in r), max(t[0] for t in r)
            spread = f"({lo:,.0f}-{hi:,.0f})"
            print(f"{size // 1024:>6}Ki {label:<15} {x:>10,.1f} {spread:>17} {g:>6.2f} {rx}"
                  f" {w:>7.2f} {rw}  {len(r)}")
    # What the cache did: per process, from MRCACHE_STATS=json.
    per = {}
    for path in sorted(glob.glob(os.path.join(stats_dir, "*.json"))):
        side = "server" if path.endswith("-server.json") else "client"
        mode = os.path.basename(path).split("-")[1]
        for line in read(path).splitlines():
            try:
                s = json.loads(line)
            except ValueError:
                continue
            per.setdefault((mode, side), []).append(s)
    for (mode, side), ss in sorted(per.items()):
        regs = [s["misses"] + s["hits"] + s["hits_containing"] + s["uncached"] for s in ss]
        print(f"statistics, {mode}, {side} ({len(ss)} processes): registrations per process "
              f"{min(regs)}-{max(regs)}, hits {sum(s['hits'] + s['hits_containing'] for s in ss)}, "
              f"misses {sum(s['misses'] for s in ss)}, memory-window grants "
              f"{sum(s['remote_grants'] for s in ss)}, median registration time per process "
              f"{median([s['registration_ns'] for s in ss]) / 1e3:,.0f} us, median self-test "
              f"{median([s['selftest_us'] for s in ss]):,.0f} us")


if __name__ == "__main__":
    section, args = sys.argv[1], sys.argv[2:]
    {"regmr": regmr, "unmap": unmap, "selftest": selftest, "evict": evict, "remote": remote,
     "riostream": riostream}[section](*args)
