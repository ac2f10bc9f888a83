/* The preload's hit fast path keeps the full path's guarantees, checked on the host with a
 * fake provider (ibv_context ops that track the objects they hand out) and, behind
 * libmrcache.so, verbs_shim.so (libibverbs' reg/dereg for calls passed through).
 *   fast_hit nested      a registration (and its deregistration) the provider makes inside
 *                        our miss path passes through, never served from the cache
 *   fast_hit fork_flush  with MRCACHE_FORK=flush, the first registration after _Fork()
 *                        does not hit the idle entry the fork must flush
 *   fast_hit patch_overwrite  our jump in libc's munmap replaced by another between two
 *                        hits: the registration after it is not a hit (caching stops)
 *   fast_hit watch_*     the watch on the patched pages (see watch() below)
 *   fast_hit double_dereg  a second ibv_dereg_mr of an MR released on the fast path, and
 *                        of one whose memory went away, is EINVAL, never the provider's
 * exit 0: kept; 1: broken (printed); 3: set-up failed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

extern pid_t _Fork(void);

#include "fake_hit.h"


/* The watch on the patched pages (docs/design/monitor.md, "The patch check"). */
static int (*watch_clean)(void);

/* Up to 5 s for the background drain (every 20 ms) to clear the watch: 1 once clean. */
static int wait_clean(void) {
    for (int i = 0; i < 500; i++) {
        if (watch_clean()) return 1;
        usleep(10000);
    }
    return 0;
}

static char *hit_buf;
static struct ibv_mr *hit_mr;
static volatile int overwritten, stop;
static int served_after, calls_after;

/* Hits in a loop; one that starts after `overwritten` was set and returns the cached MR was
 * served past the overwrite. */
static void *hitter(void *arg) {
    (void)arg;
    while (!stop) {
        int after = __atomic_load_n(&overwritten, __ATOMIC_SEQ_CST);
        struct ibv_mr *mr = ibv_reg_mr(&pd, hit_buf, LEN, IBV_ACCESS_LOCAL_WRITE);
        if (!mr || ibv_dereg_mr(mr)) exit(3);
        if (after) {
            served_after += mr == hit_mr;
            if (++calls_after >= 2000) break;
        }
    }
    return NULL;
}

/*   watch_mprotect  the watch clean, a thread hitting: libc's mprotect makes munmap's page
 *                   writable, our jump is overwritten; no hit that starts after it is served
 *   watch_pkey      the same through pkey_mprotect(pkey -1)
 *   watch_writable  munmap's page made writable before the first registration by a system
 *                   call no hook sees, left so: the watch must never clear; then the jump
 *                   is overwritten by a plain store (no call at all) before a hit
 *   watch_madvise   the watch clean: madvise(DONTNEED) over munmap's page drops our copy of
 *                   it (the page reverts to libc's file: our jump is gone); no hit after */
static int watch(const char *how, char *b, struct ibv_mr *cached) {
    watch_clean = (int (*)(void))dlsym(RTLD_DEFAULT, "mrcache_patch_watch_clean");
    uintptr_t to;
    unsigned char *jump = our_jump(&to);
    if (!watch_clean || !jump) {
        fprintf(stderr, "fast_hit: %s\n", !watch_clean ? "mrcache_patch_watch_clean not found" : "munmap not patched");
        return 3;
    }
    if (!strcmp(how, "writable")) {
        for (int i = 0; i < 25; i++) {
            if (watch_clean()) {
                fprintf(stderr, "fast_hit: the watch was cleared while munmap's page is writable\n");
                return 1;
            }
            usleep(10000);
        }
        overwrite(jump, to);
        if (ibv_reg_mr(&pd, b, LEN, IBV_ACCESS_LOCAL_WRITE) == cached) {
            fprintf(stderr, "fast_hit: a hit after a plain store over our jump on a page left writable: served blind\n");
            return 1;
        }
        printf("watch_writable: never cleared, noticed before the hit\n");
        return 0;
    }
    if (!wait_clean()) {
        fprintf(stderr, "fast_hit: the watch never cleared (every hit checks every site)\n");
        return 1;
    }
    if (!strcmp(how, "madvise")) {
        if (madvise(page_of(jump), page_size(), MADV_DONTNEED)) return 3;
        if (is_our_jump(jump)) {
            printf("watch_madvise: the page kept our jump (not a private file page?); skipped\n");
            return 0;
        }
        if (ibv_reg_mr(&pd, b, LEN, IBV_ACCESS_LOCAL_WRITE) == cached) {
            fprintf(stderr, "fast_hit: a hit after madvise(DONTNEED) dropped our jump: served blind\n");
            return 1;
        }
        printf("watch_madvise: noticed before the hit\n");
        return 0;
    }
    hit_buf = b, hit_mr = cached;
    pthread_t t;
    if (pthread_create(&t, NULL, hitter, NULL)) return 3;
    usleep(2000);
    int rc = !strcmp(how, "pkey")
                 ? pkey_mprotect(page_of(jump), 2 * page_size(), PROT_READ | PROT_WRITE | PROT_EXEC, -1)
                 : mprotect(page_of(jump), 2 * page_size(), PROT_READ | PROT_WRITE | PROT_EXEC);
    if (rc) return 3;
    overwrite(jump, to);
    __atomic_store_n(&overwritten, 1, __ATOMIC_SEQ_CST);
    pthread_join(t, NULL);
    if (served_after) {
        fprintf(stderr, "fast_hit: %d of %d hits that started after our jump was overwritten were served\n",
                served_after, calls_after);
        return 1;
    }
    printf("watch_%s: none of %d registrations after the overwrite was a hit\n", how, calls_after);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    static struct ibv_context ctx;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    if (!strcmp(argv[1], "watch_writable")) {
        /* libc patched (as `mrcache info` does: its self-test), then before the first
         * registration, past every hook (syscall() is not hooked), munmap's page made
         * writable. */
        static char report[4096];
        size_t (*selftest)(char *, size_t) = (size_t (*)(char *, size_t))dlsym(RTLD_DEFAULT, "mrcache_selftest_report");
        if (!selftest || !selftest(report, sizeof report)) return 3;
        uintptr_t to;
        unsigned char *jump = our_jump(&to);
        if (jump && syscall(SYS_mprotect, page_of(jump), 2 * page_size(), PROT_READ | PROT_WRITE | PROT_EXEC)) return 3;
    }
    char *bufs = mmap(NULL, 4 * LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *a = bufs, *b = bufs + 2 * LEN;
    /* Miss, hit on the full path (which opens the fast one), hit on the fast path. */
    struct ibv_mr *cached = cycle(b);
    if (cycle(b) != cached || cycle(b) != cached || registrations != 1) {
        fprintf(stderr, "fast_hit: the cache did not keep the registration\n");
        return 3;
    }
    if (!strcmp(argv[1], "nested")) {
        int *shim_regs = dlsym(RTLD_DEFAULT, "shim_regs"), *shim_deregs = dlsym(RTLD_DEFAULT, "shim_deregs");
        if (!shim_regs || !shim_deregs) {
            fprintf(stderr, "fast_hit: verbs_shim.so is not preloaded\n");
            return 3;
        }
        nest_in = a, nest_on = b;
        cycle(a);
        nest_in = NULL;
        if (nested_mr == cached) {
            fprintf(stderr, "fast_hit: a registration nested in our miss path was served from the cache\n");
            return 1;
        }
        if (!nested_mr || *shim_regs != 1 || *shim_deregs != 1) {
            fprintf(stderr, "fast_hit: nested reg/dereg went different ways: %p, %d registrations and %d deregistrations passed through\n",
                    (void *)nested_mr, *shim_regs, *shim_deregs);
            return 1;
        }
        if (cycle(b) != cached || !is_live(cached)) {
            fprintf(stderr, "fast_hit: the cached registration was lost (live: %d)\n", is_live(cached));
            return 1;
        }
        printf("nested: passed through, cache intact\n");
        return 0;
    }
    if (!strcmp(argv[1], "fork_flush")) {
        /* Rounds, because the background drain (every 20 ms) may flush the entry first and
         * hide a hit; with the fast path shut as it must be, every round misses. */
        for (int round = 0; round < 20; round++) {
            int before = registrations;
            pid_t pid = _Fork();
            if (pid == 0) _exit(0);
            if (pid < 0) return 3;
            cycle(b);
            if (registrations != before + 1) {
                fprintf(stderr, "fast_hit: round %d: the first registration after _Fork() hit the idle entry the fork had to flush\n", round);
                return 1;
            }
            if (waitpid(pid, NULL, 0) != pid) return 3;
            /* Cached again and hit on the full path, which opens the fast one. */
            cycle(b), cycle(b);
        }
        printf("fork_flush: flushed every time, registered again\n");
        return 0;
    }
    if (!strcmp(argv[1], "patch_overwrite")) {
        uintptr_t to;
        unsigned char *jump = our_jump(&to);
        if (!jump) {
            printf("patch_overwrite: munmap is not patched here (the self-test reports it); skipped\n");
            return 0;
        }
        if (mprotect(page_of(jump), 2 * page_size(), PROT_READ | PROT_WRITE | PROT_EXEC)) return 3;
        overwrite(jump, to);
        struct ibv_mr *after = ibv_reg_mr(&pd, b, LEN, IBV_ACCESS_LOCAL_WRITE);
        if (after == cached) {
            fprintf(stderr, "fast_hit: a hit after our munmap jump was overwritten: served blind\n");
            return 1;
        }
        if (!after || ibv_dereg_mr(after)) return 3;
        printf("patch_overwrite: noticed before the hit\n");
        return 0;
    }
    if (!strncmp(argv[1], "watch_", 6)) return watch(argv[1] + 6, b, cached);
    if (!strcmp(argv[1], "double_dereg")) {
        struct ibv_mr *mr = ibv_reg_mr(&pd, b, LEN, IBV_ACCESS_LOCAL_WRITE);
        int first = ibv_dereg_mr(mr), second = ibv_dereg_mr(mr);
        if (mr != cached || first != 0 || second != EINVAL || !is_live(cached)) {
            fprintf(stderr, "fast_hit: reg+dereg+dereg of a cached MR: %s, %d, %d (live: %d)\n",
                    mr == cached ? "hit" : "not a hit", first, second, is_live(cached));
            return 1;
        }
        /* Held while its memory goes away, released (the provider deregisters it), then
         * released again: the cache remembers it, the provider is not asked twice. */
        mr = ibv_reg_mr(&pd, b, LEN, IBV_ACCESS_LOCAL_WRITE);
        if (munmap(bufs, 4 * LEN)) return 3;
        first = ibv_dereg_mr(mr), second = ibv_dereg_mr(mr);
        if (first != 0 || second != EINVAL) {
            fprintf(stderr, "fast_hit: dereg, dereg of an MR whose memory went away: %d, %d\n", first, second);
            return 1;
        }
        printf("double_dereg: EINVAL, provider not asked\n");
        return 0;
    }
    return 2;
}
