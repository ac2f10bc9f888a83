#!/usr/bin/env python3
"""Reads the output of ci/bench's runs and prints the tables (and writes gnuplot data).

    ci/bench-report.py SECTION ARGS...

Sections: grid STATS_DIR DAT FILE... | patterns STATS_DIR DAT FILE... |
unmap DAT LABEL=FILE... | selftest STATS_DIR | first FILE... |
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


def fmt_ratio(r, x="x"):
    if r is None:
        return "-"
    return f"{r:.2f}{x}" if r < 10 else f"{r:.1f}{x}" if r < 100 else f"{r:.0f}{x}"


def size_label(b):
    return f"{b >> 20}Mi" if b >= 1 << 20 and b % (1 << 20) == 0 else f"{b >> 10}Ki"


def read_runs(pat, paths):
    """Lines 'R<round> <mode> <label> BENCH ...' of every FILE: {label: {mode: {round: rate}}}."""
    runs = {}
    for path in paths:
        for m in re.finditer(pat, read(path), re.M):
            runs.setdefault(m["label"], {}).setdefault(m["mode"], {})[int(m["round"])] = float(m["rate"])
    return runs


def ratio(by_mode, mode):
    """Median rate of MODE over the median of plain, and the range of the rounds' ratios."""
    plain, other = by_mode.get("plain", {}), by_mode.get(mode, {})
    if not plain or not other:
        return None, None, None, 0
    r = median(list(other.values())) / median(list(plain.values()))
    per = [other[k] / plain[k] for k in other if k in plain]
    return r, min(per) if per else None, max(per) if per else None, len(per)


def read_stats(stats_dir, group):
    """{(label, mode): [report, ...]} from STATS_DIR/<group>-<label>-<mode>-<round>.json."""
    out = {}
    for path in sorted(glob.glob(os.path.join(stats_dir, f"{group}-*.json"))):
        name = os.path.basename(path)[:-5]
        rest, mode, _ = name.rsplit("-", 2)
        label = rest.split("-", 1)[1]
        for line in read(path).splitlines():
            try:
                s = json.loads(line)
            except ValueError:
                continue
            out.setdefault((label, mode), []).append(s)
    return out


def cache_did(reports):
    """What the cache did over the runs: the share of registrations that hit, missed (and
    were cached) and were passed to libibverbs uncached or bypassed (summed over the runs)."""
    if not reports:
        return "(no statistics)"
    hits = sum(s.get("hits", 0) + s.get("hits_containing", 0) for s in reports)
    misses = sum(s.get("misses", 0) for s in reports)
    passed = sum(s.get("uncached", 0) + sum((s.get("bypassed") or {}).values()) for s in reports)
    total = hits + misses + passed
    if not total:
        return "(no registrations)"
    return (f"hit {100 * hits / total:.0f}%, miss {100 * misses / total:.0f}%,"
            f" passed through {100 * passed / total:.0f}%")


def decisions(reports):
    """What admission decided (the statistics' "admission" list, when the library has one):
    per access kind and size class, the verdict of each run and the median figures."""
    classes = {}
    for s in reports:
        for c in s.get("admission") or []:
            if isinstance(c, dict):
                classes.setdefault((c.get("access", "?"), c.get("class", "?")), []).append(c)
    out = []
    for (access, cls), cs in sorted(classes.items()):
        verdicts = "/".join(c.get("verdict", "?") for c in cs)
        miss = median([c.get("miss_ns", 0) for c in cs]) / 1e3
        cached = median([c.get("cached_ns", 0) for c in cs]) / 1e3
        evict = median([c.get("evict_ns", 0) for c in cs]) / 1e3
        src = cs[-1].get("cached_from", "")
        passed = sum(c.get("passed", 0) for c in cs)
        trials = sum(c.get("trials", 0) for c in cs)
        out.append(f"{access} {cls}: {verdicts} (miss {miss:,.1f} us, cached round {cached:,.1f} us"
                   f" [{src}], eviction {evict:,.1f} us; passed {passed}, trials {trials})")
    counts = {k: sum(s.get(k, 0) for s in reports)
              for k in ("admission_passed_cost", "admission_passed_scan", "admission_trials")}
    if any(counts.values()):
        out.append(", ".join(f"{k} {v}" for k, v in counts.items()))
    return "; ".join(out)


MODES = [("default", "default (revoke)"), ("keep", "keep"), ("bypass", "bypass")]


def grid(stats_dir, dat_path, *paths):
    """bench/regmr runs by access and size: the speed-up of each mode over plain."""
    pat = (r"^R(?P<round>\d+) (?P<mode>\S+) (?P<label>\S+) BENCH size=\d+ access=\S+ iters=\d+ "
           r"ns_per_pair=\S+ regs_per_s=(?P<rate>\S+)")
    runs = read_runs(pat, paths)
    stats = read_stats(stats_dir, "grid")
    keys = []
    for label in runs:
        access, size = label.split(":")
        mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[size[-1]]
        keys.append((access != "local", int(size[:-1]) * mult, label))
    if not keys:
        print("grid: no figures (the runs failed?)")
        return
    print("reg+dereg of one buffer (one process per size and mode): speed-up over libibverbs alone,")
    print("median pairs/s of the preloaded runs over the median of the plain ones (range of the")
    print("rounds' own ratios); 'the default did': the cache's statistics over the default's runs;")
    print("MRCACHE_REMOTE (keep, bypass) applies to remote access only")
    print(f"{'access':<7}{'buffer':>6} {'libibverbs':>11}  {'default (revoke)':<21} {'keep':<21}"
          f" {'bypass':<21} runs  the default did")
    notes = []
    with open(dat_path, "w") as dat:
        dat.write("size_KiB local_default local_keep local_bypass remote_default remote_keep remote_bypass\n")
        rows = {}
        for remote, size, label in sorted(keys):
            by_mode = runs[label]
            base = median(list(by_mode.get("plain", {}).values()))
            cells, n = [], 0
            for mode, _ in MODES:
                r, lo, hi, k = ratio(by_mode, mode)
                n = max(n, k)
                cells.append(f"{fmt_ratio(r)} ({fmt_ratio(lo, '')}-{fmt_ratio(hi, '')})" if r else "-")
                rows.setdefault(size, {})[("remote" if remote else "local", mode)] = r
            b = f"{base:>9,.0f}/s" if base else f"{'-':>11}"
            print(f"{'remote' if remote else 'local':<7}{size_label(size):>6} {b}  {cells[0]:<21}"
                  f" {cells[1]:<21} {cells[2]:<21} {n:>4}  {cache_did(stats.get((label, 'default'), []))}")
            d = decisions(stats.get((label, "default"), []))
            if d:
                notes.append(f"  {'remote' if remote else 'local'} {size_label(size)}: {d}")
        for size in sorted(rows):
            vals = [rows[size].get((a, m)) for a in ("local", "remote") for m, _ in MODES]
            dat.write(f"{size // 1024} " + " ".join(f"{v:.3f}" if v else "-" for v in vals) + "\n")
    if notes:
        print("what the default's admission decided (from its statistics):")
        print("\n".join(notes))


PATTERNS = [
    ("cyclic-1.5x", "cyclic 48 x 64Ki, 32 entries (1.5x)"),
    ("cyclic-2x", "cyclic 64 x 64Ki, 32 entries (2x)"),
    ("cyclic-4x", "cyclic 128 x 64Ki, 32 entries (4x)"),
    ("zipf", "Zipf-like 256 x 64Ki, 32 entries"),
    ("bytes-2x", "cyclic 8 x 1Mi, MAX_BYTES=4M (2x)"),
    ("fits", "cyclic 64 x 64Ki, 128 entries (fits)"),
    ("remote-cyclic-2x", "remote, cyclic 64 x 64Ki, 32 entries"),
]


def patterns(stats_dir, dat_path, *paths):
    """bench/evict runs by pattern: the speed-up of each mode over plain, and the hit ratio."""
    pat = (r"^R(?P<round>\d+) (?P<mode>\S+) (?P<label>\S+) BENCH evict pattern=\S+ buffers=\d+ "
           r"size=\d+ access=\S+ iters=\d+ ns_per_pair=\d+ pairs_per_s=(?P<rate>\d+)")
    runs = read_runs(pat, paths)
    stats = read_stats(stats_dir, "patterns")
    if not runs:
        print("patterns: no figures (the runs failed?)")
        return
    print("working sets and the cache: N buffers registered and deregistered in turn, local access")
    print("unless said, the cache limited by MRCACHE_MAX_ENTRIES or MRCACHE_MAX_BYTES; speed-up")
    print("over libibverbs alone (range of the rounds' ratios); what the cache did (statistics)")
    print(f"{'pattern':<38} {'libibverbs':>11}  {'speed-up':<21} runs  the cache did")
    notes = []
    with open(dat_path, "w") as dat:
        dat.write('pattern "default (revoke)" "keep" "bypass"\n')
        for label, text in PATTERNS:
            by_mode = runs.get(label)
            if not by_mode:
                continue
            base = median(list(by_mode.get("plain", {}).values()))
            vals = []
            for mode, name in MODES:
                r, lo, hi, k = ratio(by_mode, mode)
                vals.append(r)
                if r is None:
                    continue
                cell = f"{fmt_ratio(r)} ({fmt_ratio(lo, '')}-{fmt_ratio(hi, '')})"
                if mode == "default" and len(by_mode) > 2:
                    print(text)
                lead = text if mode == "default" and len(by_mode) <= 2 else f"  {name}"
                b = f"{base:>9,.0f}/s" if mode == "default" and base else " " * 11
                print(f"{lead:<38} {b}  {cell:<21} {k:>4}  {cache_did(stats.get((label, mode), []))}")
            d = decisions(stats.get((label, "default"), []))
            if d:
                notes.append(f"  {label}: {d}")
            dat.write(f"{label} " + " ".join(f"{v:.3f}" if v else "-" for v in vals) + "\n")
    if notes:
        print("what the default's admission decided (from its statistics):")
        print("\n".join(notes))


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


def selftest(stats_dir):
    us = []
    for path in glob.glob(os.path.join(stats_dir, "*.json")):
        for line in read(path).splitlines():
            try:
                us.append(json.loads(line)["selftest_us"])
            except (ValueError, KeyError, TypeError):
                continue
    if us:
        print(f"startup self-test (at the first registration, in the VM): {median(us):,.0f} us"
              f" (median of {len(us)} processes)")


def first(*paths):
    """The first pair of each bench/regmr and bench/evict process, made before its timed loop
    (under the preload: the library's set-up at the first registration), by mode."""
    pat = r"^R\d+ (?P<mode>\S+) \S+ BENCH .* first_pair_ns=(?P<ns>\d+)"
    by_mode = {}
    for path in paths:
        for m in re.finditer(pat, read(path), re.M):
            by_mode.setdefault(m["mode"], []).append(float(m["ns"]))
    if not by_mode:
        return
    cells = [f"{mode} {median(v) / 1e6:,.1f} ms ({min(v) / 1e6:,.1f}-{max(v) / 1e6:,.1f})"
             for mode, v in sorted(by_mode.items(), key=lambda kv: kv[0] != "plain")]
    n = sum(len(v) for v in by_mode.values())
    print("first reg+dereg of each process, before its timed loop (the preload's set-up is in it):"
          f" median (range) by mode, {n} processes:")
    print("  " + "; ".join(cells))


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
    {"grid": grid, "patterns": patterns, "unmap": unmap, "selftest": selftest, "first": first,
     "remote": remote,
     "riostream": riostream}[section](*args)
