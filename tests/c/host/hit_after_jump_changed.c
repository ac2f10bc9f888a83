/* The watch word (docs/design/monitor.md, "The patch check"): sequences
 * that change the bytes of our jump in libc's munmap after the watch cleared, each followed by
 * hits that must not be served. Built like fast_hit.c (fake provider, verbs_shim.so).
 *   hit_after_jump_changed memfd_alias   libc's munmap page replaced (MAP_FIXED, hooked) by a read-only
 *                         MAP_SHARED view of a memfd holding the same bytes; once the watch is
 *                         clean, the jump is overwritten through a writable alias of the memfd
 *   hit_after_jump_changed file_private  the same with a MAP_PRIVATE read-only mapping of a file holding the
 *                         same bytes; overwritten by pwrite(2) to the file (page not yet CoW)
 *   hit_after_jump_changed mremap_fixed  a modified copy mremap(MREMAP_FIXED)ed over the page (hooked)
 *   hit_after_jump_changed libc_mprotect libc's own mprotect (dlsym on libc's handle): the stated gap, window
 *   hit_after_jump_changed errno         mprotect/pkey_mprotect hooks: -1 and errno on failure
 *   hit_after_jump_changed memfd_stale   memfd_alias, then munmap through libc's entry unseen: a stale hit
 *   hit_after_jump_changed writable_after_clean  page made writable past the hooks after a clean, left so
 *   hit_after_jump_changed race          hooked mprotect + store at random offsets from the drain cycle
 *   hit_after_jump_changed fork_child    clean at fork, the child overwrites past the hooks
 *   hit_after_jump_changed partial       mprotect(page - PAGE, PAGE + 1): a length one byte into the page
 *   hit_after_jump_changed advice        madvise advice not counted as zapping, over the page
 *   hit_after_jump_changed maps_costN    figures: CPU of the maps read with N mappings while suspect
 * exit 0: held; 1: broken (printed); 3: set-up failed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>


extern pid_t _Fork(void);

#include "fake_hit.h"

#define PAGE page_size()


static int (*watch_clean)(void);

/* Whether the kernel answers PROCMAP_QUERY (Linux 6.11; qemu-user does not): the drain then
 * re-checks every cycle (20 ms), else it reads /proc/self/maps every 50 cycles (1 s). */
static int has_procmap_query(void) {
    struct {
        uint64_t size, flags, addr, start, end, vma_flags, page_size, offset, inode;
        uint32_t major, minor, name_size, build_id_size;
        uint64_t name_addr, build_id_addr;
    } q = {0};
    q.size = sizeof q;
    q.flags = 0x10; /* PROCMAP_QUERY_COVERING_OR_NEXT_VMA */
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    int r = ioctl(fd, 0xC0686611ul /* _IOWR('f', 17, struct procmap_query) */, &q);
    close(fd);
    return r == 0;
}
/* With MRCACHE_PATCH_CHECK=every-hit the word never clears: wait as long, then go on (the
 * same sequence must then be caught by the per-hit check). */
static int wait_clean(void) {
    const char *c = getenv("MRCACHE_PATCH_CHECK");
    if (c && !strcmp(c, "every-hit")) {
        usleep(100000);
        return 1;
    }
    for (int i = 0; i < 500; i++) {
        if (watch_clean()) return 1;
        usleep(10000);
    }
    return 0;
}

/* Hits after the overwrite: how many of n were served from the cache. */
static int served(char *b, struct ibv_mr *cached, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) {
        struct ibv_mr *mr = ibv_reg_mr(&pd, b, LEN, IBV_ACCESS_LOCAL_WRITE);
        if (!mr) exit(3);
        s += mr == cached;
        if (ibv_dereg_mr(mr)) exit(3);
    }
    return s;
}

#include <time.h>
static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Hits until the first that is not served (or 5 s): how long the window stays open. */
static void window(const char *how, char *b, struct ibv_mr *cached) {
    double t0 = now_ms();
    long n = 0;
    while (now_ms() - t0 < 5000 && served(b, cached, 1)) n++;
    fprintf(stderr, "hit_after_jump_changed %s: %ld hits served over %.1f ms after the overwrite, until %s\n", how, n,
            now_ms() - t0, now_ms() - t0 >= 5000 ? "the 5 s limit (never noticed)" : "the first miss");
}

static int verdict(const char *how, int s, int n) {
    if (s) {
        fprintf(stderr, "hit_after_jump_changed %s: %d of %d hits after our jump was overwritten were served (watch clean: %d)\n",
                how, s, n, watch_clean());
        return 1;
    }
    printf("hit_after_jump_changed %s: none of %d registrations after the overwrite was a hit\n", how, n);
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

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    static struct ibv_context ctx;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    const char *how = argv[1];
    if (!strcmp(how, "errno")) {
        errno = 0;
        int r1 = mprotect((void *)4097, 4096, PROT_READ), e1 = errno;
        errno = 0;
        int r2 = pkey_mprotect((void *)4097, 4096, PROT_READ, -1), e2 = errno;
        /* A call that succeeds and changes nothing (errno's page is read-write already; not
         * a zero length: qemu-user 7.2 answers that with ENOMEM). */
        errno = 1234;
        int r3 = mprotect(page_of(&errno), PAGE, PROT_READ | PROT_WRITE), e3 = errno;
        printf("hit_after_jump_changed errno: mprotect %d/%d, pkey_mprotect %d/%d, ok-call %d/%d (want -1/%d twice, 0/1234)\n",
               r1, e1, r2, e2, r3, e3, EINVAL);
        return !(r1 == -1 && e1 == EINVAL && r2 == -1 && e2 == EINVAL && r3 == 0 && e3 == 1234);
    }
    char *bufs = mmap(NULL, 4 * LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *b = bufs + 2 * LEN;
    struct ibv_mr *cached = cycle(b);
    if (cycle(b) != cached || cycle(b) != cached || registrations != 1) {
        fprintf(stderr, "hit_after_jump_changed: the cache did not keep the registration\n");
        return 3;
    }
    watch_clean = (int (*)(void))dlsym(RTLD_DEFAULT, "mrcache_patch_watch_clean");
    uintptr_t to;
    unsigned char *jump = our_jump(&to);
    if (!watch_clean || !jump) {
        fprintf(stderr, "hit_after_jump_changed: %s\n", !watch_clean ? "mrcache_patch_watch_clean not found" : "munmap not patched");
        return 3;
    }
    if (!wait_clean()) {
        fprintf(stderr, "hit_after_jump_changed: the watch never cleared\n");
        return 3;
    }
    unsigned char *page = page_of(jump);
    size_t off = jump - page;
    if (!strcmp(how, "fork_fd") || !strcmp(how, "fork_fd_maps")) {
        /* fork_fd_maps: the child's own file is its parent's /proc/PID/maps, the very file
         * the inherited descriptor names (so no identity check can tell them apart). */
        int parents = !strcmp(how, "fork_fd_maps");
        char want[64];
        snprintf(want, sizeof want, "/proc/%d/maps", (int)getpid());
        /* The watch's /proc/self/maps descriptor is inherited by a fork child, which closes
         * every descriptor above 2 (as daemons and spawners do) and opens a file of its own
         * that takes the same number, then registers (its drain thread starts). The library
         * must never close or reuse the child's file. */
        int n = -1;
        char p[64], t[256];
        for (int fd = 3; fd < 1024 && n < 0; fd++) {
            snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
            ssize_t l = readlink(p, t, sizeof t - 1);
            if (l > 0 && (t[l] = 0, strstr(t, "/maps"))) n = fd;
        }
        if (n < 0) {
            printf("hit_after_jump_changed %s: no /proc/self/maps descriptor kept (no PROCMAP_QUERY here): nothing to inherit\n", how);
            return 0;
        }
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) return 3;
        if (pid == 0) {
            for (int fd = 3; fd < 1024; fd++) close(fd);
            int mine = parents ? open(want, O_RDONLY) : memfd_create("child-file", 0);
            if (mine < 0) _exit(3);
            if (mine != n && (dup2(mine, n) != n || close(mine))) _exit(3);
            char *c = mmap(NULL, 2 * LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (c == MAP_FAILED) _exit(3);
            /* A context of its own (the parent's is not usable after fork), then the child's
             * first registrations: its drain thread starts. */
            static struct ibv_context own;
            own.ops = pd.context->ops;
            own.cmd_fd = open("/dev/null", O_RDWR);
            pd.context = &own;
            cycle(c), cycle(c + LEN), cycle(c);
            usleep(500000);
            snprintf(p, sizeof p, "/proc/self/fd/%d", n);
            ssize_t l = readlink(p, t, sizeof t - 1);
            t[l > 0 ? l : 0] = 0;
            char one;
            int kept = parents ? !strcmp(t, want) && read(n, &one, 1) == 1
                               : strstr(t, "child-file") != NULL && write(n, "x", 1) == 1;
            fprintf(stderr, "hit_after_jump_changed %s: child: 500 ms after its first registration, its descriptor %d names '%s'%s\n",
                    how, n, t, kept ? "" : ": the library closed the child's file");
            _exit(kept ? 0 : 1);
        }
        int st;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return 3;
        if (WEXITSTATUS(st) == 0) printf("hit_after_jump_changed %s: the child's file kept its descriptor %d\n", how, n);
        return WEXITSTATUS(st);
    }
    if (!strcmp(how, "memfd_alias")) {
        int fd = memfd_create("libc-page", 0);
        if (fd < 0 || ftruncate(fd, PAGE)) return 3;
        unsigned char *alias = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (alias == MAP_FAILED) return 3;
        memcpy(alias, page, PAGE);
        /* Same bytes, same address: a read-only, executable view (mmap is hooked: watched). */
        if (mmap(page, PAGE, PROT_READ | PROT_EXEC, MAP_SHARED | MAP_FIXED, fd, 0) != page) return 3;
        if (!wait_clean()) {
            printf("hit_after_jump_changed memfd_alias: the watch never cleared again (refused a shared page): held\n");
            return 0;
        }
        overwrite(alias + off, to); /* a plain store, no system call */
        if (is_our_jump(jump)) return 3;
        int s = served(b, cached, 1000);
        if (s) window(how, b, cached);
        return verdict(how, s, 1000);
    }
    if (!strncmp(how, "maps_cost", 9)) {
        /* Figures, not a test: the process's CPU time over 2 s of sleep with N mappings
         * (maps_costN), munmap's page left writable by a system call no hook sees (so the
         * word stays suspect and every drain cycle reads /proc/self/maps), then the same
         * with the page read-only again (the word clean). */
        long n = atol(how + 9);
        for (long i = 0; i < n; i++)
            if (mmap(NULL, PAGE, i % 2 ? PROT_READ : PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED) return 3;
        for (int round = 0; round < 2; round++) {
            mprotect(page, PAGE, round ? PROT_READ | PROT_EXEC : PROT_READ | PROT_WRITE | PROT_EXEC);
            usleep(200000);
            struct timespec a, z;
            clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
            double t0 = now_ms();
            /* munmap/mmap pairs on the main thread meanwhile: the mmap lock the maps read takes */
            long pairs = 0;
            while (now_ms() - t0 < 2000) {
                void *q = mmap(NULL, PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                munmap(q, PAGE);
                pairs++;
                if (pairs % 64 == 0) usleep(1000);
            }
            clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &z);
            double cpu = (z.tv_sec - a.tv_sec) * 1e3 + (z.tv_nsec - a.tv_nsec) / 1e6;
            printf("hit_after_jump_changed maps_cost: %ld mappings, page %s, watch clean %d: %.0f ms CPU over 2 s, %ld mmap+munmap pairs\n",
                   n, round ? "read-only" : "writable", watch_clean(), cpu, pairs);
        }
        return 0;
    }
    if (!strcmp(how, "race")) {
        /* A hooked mprotect patcher at random offsets from the drain's 20 ms cycle: delays
         * before mprotect(RW), between it and the store, and before mprotect(RX). */
        srand(getpid());
        hit_buf = b, hit_mr = cached;
        pthread_t t;
        if (pthread_create(&t, NULL, hitter, NULL)) return 3;
        usleep(rand() % 40000);
        if (mprotect(page, PAGE, PROT_READ | PROT_WRITE | PROT_EXEC)) return 3;
        usleep(rand() % 3 ? rand() % 45000 : 0);
        overwrite(jump, to);
        __atomic_store_n(&overwritten, 1, __ATOMIC_SEQ_CST);
        usleep(rand() % 3 ? rand() % 45000 : 0);
        if (mprotect(page, PAGE, PROT_READ | PROT_EXEC)) return 3;
        pthread_join(t, NULL);
        return verdict(how, served_after, calls_after);
    }
    if (!strcmp(how, "fork_child")) {
        /* The word clean at fork(); in the child a writer past the hooks (the stated gap:
         * syscall(SYS_mprotect)) overwrites our jump and restores the protection. The design
         * bounds the window by the drain cycle (20 ms); the child has no drain thread until
         * its first full-path registration. Hits for 1 s. */
        pid_t pid = fork();
        if (pid < 0) return 3;
        if (pid == 0) {
            if (syscall(SYS_mprotect, page, PAGE, PROT_READ | PROT_WRITE | PROT_EXEC)) _exit(3);
            overwrite(jump, to);
            if (syscall(SYS_mprotect, page, PAGE, PROT_READ | PROT_EXEC)) _exit(3);
            double t0 = now_ms();
            long n = 0, s = 0;
            while (now_ms() - t0 < 1000) s += served(b, cached, 1), n++;
            fprintf(stderr, "hit_after_jump_changed fork_child: child: %ld of %ld hits over 1 s after the overwrite were served\n", s, n);
            _exit(s ? 1 : 0);
        }
        int st;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return 3;
        if (WEXITSTATUS(st) == 0) printf("hit_after_jump_changed fork_child: no hit served in the child\n");
        return WEXITSTATUS(st);
    }
    if (!strcmp(how, "advice")) {
        /* madvise advice the hook does not count as zapping, over munmap's page (and the
         * 2 MiB around it for MADV_COLLAPSE): does any drop our copy of the page? */
        static const int adv[] = {MADV_NORMAL, MADV_RANDOM, MADV_SEQUENTIAL, MADV_WILLNEED, 20 /* COLD */,
                                  21 /* PAGEOUT */, 25 /* COLLAPSE */, 22 /* POPULATE_READ */, 14 /* HUGEPAGE */,
                                  MADV_DONTFORK, MADV_DOFORK, 12 /* MERGEABLE */, 16 /* DODUMP */};
        for (unsigned k = 0; k < sizeof adv / sizeof *adv; k++) {
            void *at = adv[k] == 25 ? (void *)((uintptr_t)page & ~(uintptr_t)0x1fffff) : (void *)page;
            size_t len = adv[k] == 25 ? 0x200000 : PAGE;
            errno = 0;
            int r = madvise(at, len, adv[k]);
            int e = errno;
            if (!is_our_jump(jump)) {
                int s = served(b, cached, 1000);
                fprintf(stderr, "hit_after_jump_changed advice: madvise %d (rc %d) dropped our jump; %d of 1000 hits served, clean %d\n", adv[k], r, s, watch_clean());
                return 1;
            }
            printf("hit_after_jump_changed advice: madvise %d: rc %d errno %d, jump kept\n", adv[k], r, e);
        }
        return 0;
    }
    if (!strcmp(how, "partial")) {
        /* mprotect from the page before, one byte into munmap's page (the kernel rounds the
         * length up: the whole page turns writable), then a store and read-only again. */
        if (mprotect(page - PAGE, PAGE + 1, PROT_READ | PROT_WRITE | PROT_EXEC)) return 3;
        overwrite(jump, to);
        if (mprotect(page - PAGE, PAGE + 1, PROT_READ | PROT_EXEC)) return 3;
        return verdict(how, served(b, cached, 1000), 1000);
    }
    if (!strcmp(how, "writable_after_clean")) {
        /* The word clean; munmap's page made writable by a system call no hook sees (a stated
         * gap) and left so; the design says a page left writable keeps every hit checking.
         * Several drain cycles later (200 ms; only where the drain reads /proc/self/maps
         * instead of PROCMAP_QUERY, as under qemu-user, the design's bound is 50 cycles, 1 s:
         * up to 1.5 s then), a plain store over our jump. */
        if (syscall(SYS_mprotect, page, PAGE, PROT_READ | PROT_WRITE | PROT_EXEC)) return 3;
        usleep(200000);
        int waited = 200, bound = has_procmap_query() ? 200 : 1500;
        for (; waited < bound && watch_clean(); waited += 10) usleep(10000);
        int clean = watch_clean();
        overwrite(jump, to);
        int s = served(b, cached, 1000);
        fprintf(stderr, "hit_after_jump_changed writable_after_clean: %d ms after, the page writable: watch clean %d\n", waited, clean);
        if (s) window(how, b, cached);
        return verdict(how, s, 1000);
    }
    if (!strcmp(how, "memfd_stale")) {
        /* As memfd_alias, but the store puts a bare munmap system call stub at our jump
         * (munmap_stub): munmap no longer reaches our hook. Then the cached
         * buffer is unmapped and mapped again (fresh pages, same address, no MAP_FIXED). */
        int fd = memfd_create("libc-page", 0);
        if (fd < 0 || ftruncate(fd, PAGE)) return 3;
        unsigned char *alias = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (alias == MAP_FAILED) return 3;
        memcpy(alias, page, PAGE);
        if (mmap(page, PAGE, PROT_READ | PROT_EXEC, MAP_SHARED | MAP_FIXED, fd, 0) != page) return 3;
        if (!wait_clean()) {
            printf("hit_after_jump_changed memfd_stale: the watch never cleared again: held\n");
            return 0;
        }
        unsigned char stub[12];
        size_t n = munmap_stub(stub);
        /* libc's own entry (glibc's internal callers, free() of a large block, take it). */
        int (*libc_munmap)(void *, size_t) =
            (int (*)(void *, size_t))dlsym(dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY), "munmap");
        memcpy(alias + off, stub, n);
        __builtin___clear_cache((char *)alias + off, (char *)alias + off + n);
        __builtin___clear_cache((char *)jump, (char *)jump + n); /* the address executed */
        if (libc_munmap(bufs, 4 * LEN)) return 3;
        char *again = mmap(NULL, 4 * LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (again != bufs) {
            printf("hit_after_jump_changed memfd_stale: the address was not reused; skipped\n");
            return 0;
        }
        struct ibv_mr *mr = ibv_reg_mr(&pd, b, LEN, IBV_ACCESS_LOCAL_WRITE);
        if (mr == cached) {
            fprintf(stderr, "hit_after_jump_changed memfd_stale: STALE: the registration of the unmapped pages was served for the new ones at %p\n", (void *)b);
            return 1;
        }
        printf("hit_after_jump_changed memfd_stale: not a hit\n");
        return 0;
    }
    if (!strcmp(how, "file_private")) {
        char path[] = "/tmp/hit_pageXXXXXX";
        int fd = mkstemp(path);
        if (fd < 0 || write(fd, page, PAGE) != (ssize_t)PAGE) return 3;
        unlink(path);
        if (mmap(page, PAGE, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED, fd, 0) != page) return 3;
        if (!wait_clean()) {
            printf("hit_after_jump_changed file_private: the watch never cleared again: held\n");
            return 0;
        }
        unsigned char other[16];
        ssize_t n = (ssize_t)other_jump(other, to);
        if (pwrite(fd, other, n, off) != n) return 3;
        if (is_our_jump(jump)) {
            printf("hit_after_jump_changed file_private: the private page did not follow the file; held\n");
            return 0;
        }
        int s = served(b, cached, 1000);
        if (s) window(how, b, cached);
        return verdict(how, s, 1000);
    }
    if (!strcmp(how, "mremap_fixed")) {
        unsigned char *copy = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        memcpy(copy, page, PAGE);
        overwrite(copy + off, to);
        if (mprotect(copy, PAGE, PROT_READ | PROT_EXEC)) return 3;
        if (mremap(copy, PAGE, PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, page) != page) return 3;
        int s = served(b, cached, 1000);
        if (s) window(how, b, cached);
        return verdict(how, s, 1000);
    }
    if (!strcmp(how, "libc_mprotect")) {
        int (*libc_mprotect)(void *, size_t, int) =
            (int (*)(void *, size_t, int))dlsym(dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY), "mprotect");
        int (*ours)(void *, size_t, int) = mprotect;
        printf("hit_after_jump_changed libc_mprotect: dlsym(libc, \"mprotect\") %s our hook\n", libc_mprotect == ours ? "is" : "is NOT");
        if (libc_mprotect(page, PAGE, PROT_READ | PROT_WRITE | PROT_EXEC)) return 3;
        overwrite(jump, to);
        if (libc_mprotect(page, PAGE, PROT_READ | PROT_EXEC)) return 3;
        int s = served(b, cached, 1);
        if (s) window(how, b, cached);
        return verdict(how, s, 1);
    }
    return 2;
}
