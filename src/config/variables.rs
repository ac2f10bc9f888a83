//! The table of `MRCACHE_*` variables: each name, default, allowed values and what it does
//! (the man page and docs/configuration.md are made and checked from it).

/// Every variable the library reads. docs/configuration.md is checked against this table.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "MRCACHE_ENABLE",
        default: "1",
        allowed: "1, 0 (also on/off, true/false, yes/no)",
        about: "0 turns the cache off: every call goes straight to libibverbs",
    },
    Variable {
        name: "MRCACHE_MAX_ENTRIES",
        default: "16384",
        allowed: "a positive integer, or unlimited",
        about: "most registrations kept; idle ones beyond it are evicted, least recently used first",
    },
    Variable {
        name: "MRCACHE_MAX_BYTES",
        default: "auto (a quarter of physical memory, divided by the ranks on the node, at most 3/4 of RLIMIT_MEMLOCK)",
        allowed: "bytes with optional K, M, G, T suffix (powers of 1024: 512M, 4G, 1.5G), auto, or unlimited",
        about: "most bytes kept registered (pinned); idle entries beyond it are evicted",
    },
    Variable {
        name: "MRCACHE_SHADOW",
        default: "1",
        allowed: "1 or 0",
        about: "hand each concurrent user of one cached registration its own ibv_mr copy with its own addr/length; 0 shares the provider's object and disables containing-range hits",
    },
    Variable {
        name: "MRCACHE_REMOTE_SUPERSET",
        default: "0",
        allowed: "1 or 0",
        about: "1 lets a request with remote access hit a cached registration of a containing range or with more remote rights (widens what a peer can reach: opt in knowingly)",
    },
    Variable {
        name: "MRCACHE_REMOTE",
        default: "revoke",
        allowed: "revoke, keep, bypass",
        about: "registrations with remote access: revoke = cached, but the app's rkey is a memory window bound at each registration and unbound before ibv_dereg_mr returns, so an old key reaches nothing (a fresh key at every hit); keep = the registration's own rkey stays valid while it is cached (a peer holding it can still write into the memory after ibv_dereg_mr, even after free: only for peers you trust); bypass = not cached, passed to libibverbs",
    },
    Variable {
        name: "MRCACHE_ADMIT",
        default: "auto",
        allowed: "auto, always",
        about: "auto = cache a registration's size class (power of two of its length) and access kind (local, remote under revoke) only while its measured cached round (hit + release, with the window bind and unbind for remote) costs less than the provider's reg + dereg, else pass it through (a cached trial after 32 misses, backing off to 1024, re-measures); and when the cache is full, evict for a new registration only if it was seen more often lately than the victim was used (scan resistance); always = cache every registration, evict least recently used (the figures are still measured and reported)",
    },
    Variable {
        name: "MRCACHE_MONITOR",
        default: "patch",
        allowed: "patch, symbols, none",
        about: "how unmapped memory is seen: patch = symbol hooks plus glibc's internal munmap/madvise/mmap/brk patched at the first registration (sees free(), malloc_trim, arena shrink); symbols = symbol hooks only (misses those, so caching is off); none = nothing (UNSAFE: for tests that must see stale registrations)",
    },
    Variable {
        name: "MRCACHE_ODP",
        default: "auto",
        allowed: "auto, on, off",
        about: "entries registered ON_DEMAND (On-Demand Paging), on a device that pages them so for RC send, receive, write and read (and atomics when asked): the kernel then follows every change of the range, seen by the monitor or not; auto = only where the monitor cannot see every unmap (a sanitizer's allocator, refused patching, MRCACHE_MONITOR=symbols): only such entries are cached there, instead of none, on a device that also pages UD send and receive and RC's shared-receive-queue receives on demand, never a device whose on-demand transfers its profile found misplaced, nor rxe without a profile (whose on-demand copy misplaces data within a page on the kernels tested); where pinning fails for want of lockable memory (ENOMEM, the memlock limit), that entry on demand; and from the size where MRCACHE_ODP_PROFILE measured an on-demand miss cheaper than a pinned one; on = every entry the device can register on demand, and with the monitor off or blind only those are cached; off = never (every entry pinned; where the monitor is blind caching is off). Remote registrations are cached on demand only under MRCACHE_REMOTE=revoke",
    },
    Variable {
        name: "MRCACHE_ODP_PROFILE",
        default: "unset",
        allowed: "the absolute path of a file mrcache bench --odp-profile FILE wrote",
        about: "what MRCACHE_ODP=auto measured on one kind of device (its vendor and part ids and firmware, under the kernel it ran under): where an on-demand miss (registration and the device's first-touch fault) cost less than a pinned one in every round, auto registers entries of that size and up on demand on devices of that kind, also where the monitor sees (remote ones only under MRCACHE_REMOTE=revoke); a device whose on-demand writes it found misplacing data is never chosen, and one it found keeping them is chosen even if rxe; a profile of another kernel is not used. Unreadable, not a regular file, over 64 KiB or malformed: the cache is off. Read only with the cache on under MRCACHE_ODP=auto",
    },
    Variable {
        name: "MRCACHE_PATCH_CHECK",
        default: "watch",
        allowed: "watch, every-hit",
        about: "with MRCACHE_MONITOR=patch, when a hit reads every patched libc entry and hook to see that no other code patcher overwrote one: watch = only while a patched code page may have been made writable, replaced or dropped since the last check (seen by the mprotect, pkey_mprotect and unmap hooks and libc's patched mprotect entry, while every patched page is still the one patched; writers that bypass libc are seen by the background check within 20 ms, see docs/design/monitor.md); every-hit = on every hit (about 290 instructions more per hit pair)",
    },
    Variable {
        name: "MRCACHE_VERIFY",
        default: "off",
        allowed: "off, pfn",
        about: "pfn (root only): on every hit, compare the page frame numbers now backing the range (/proc/self/pagemap) with those recorded at registration; a mismatch is reported loudly and treated as a miss",
    },
    Variable {
        name: "MRCACHE_FORK",
        default: "auto",
        allowed: "auto, keep, flush",
        about: "what to do at fork(): auto = keep everything when the kernel copies pinned pages at fork (Linux >= 5.13), else flush; keep = never flush; flush = deregister idle entries before every fork and, when libibverbs' fork tracking is on, mark ranges in use MADV_DONTFORK for the fork",
    },
    Variable {
        name: "MRCACHE_LOG",
        default: "off",
        allowed: "off, error, warn, info, debug, trace, or target=level directives, comma-separated (spaces around each ignored), each with a level (info, mrcache::call=trace; mrcache= with no level, and span or field filters, are refused)",
        about: "info: decisions the library makes (fork handling, the self-test); trace: also one line per interposed call (call, arguments, result, hit/miss/bypass/invalidate, duration)",
    },
    Variable {
        name: "MRCACHE_LOG_FORMAT",
        default: "text",
        allowed: "text, json",
        about: "json writes each log and trace line as one JSON object (tracing-subscriber's JSON format: level, target, message, and for a traced call its fields: call, outcome, tid, at_ns, dur_ns, result), for tools",
    },
    Variable {
        name: "MRCACHE_TRACE_BUFFER",
        default: "8192",
        allowed: "an integer from 16 to 16777216 (records)",
        about: "size of the trace ring at MRCACHE_LOG=trace; when the writer falls behind, new records are dropped and counted, never waited for",
    },
    Variable {
        name: "MRCACHE_STATS",
        default: "0",
        allowed: "0, 1, json",
        about: "1 prints a summary of the cache's counters on stderr at exit; json writes one JSON object per process (to MRCACHE_STATS_FILE, else MRCACHE_LOG_FILE, else stderr) for `mrcache stats`",
    },
    Variable {
        name: "MRCACHE_STATS_FILE",
        default: "(none)",
        allowed: "a file path; %p is replaced by the pid, %h by the host name",
        about: "where MRCACHE_STATS=json appends its JSON line",
    },
    Variable {
        name: "MRCACHE_LOG_FILE",
        default: "(none: stderr)",
        allowed: "a file path; %p is replaced by the pid, %h by the host name",
        about: "where log and trace lines go (appended); a fork child with %p in the name gets its own file",
    },
];

/// One `MRCACHE_*` variable, as the reference documents it.
pub struct Variable {
    /// The variable's name, `MRCACHE_...`.
    pub name: &'static str,
    /// Its value when unset.
    pub default: &'static str,
    /// The values it accepts.
    pub allowed: &'static str,
    /// What it does, one paragraph.
    pub about: &'static str,
}
