/* A uprobe on libc's mmap or munmap entry while libmrcache.so has patched it. The program
 * runs with a private copy of libc (LD_LIBRARY_PATH; the test copies it), and attaches the
 * probe through perf_event_open with the uprobe PMU, limited to this process, so nothing
 * else on the machine is probed. The kernel puts an int3 over the entry's first byte,
 * single-steps the file's first instruction out of line, and writes the file's first byte
 * back when the probe goes.
 *   uprobe_entry plain_munmap N  no verbs: N rounds of attach, large malloc/free (glibc's
 *                                own __munmap) and mmap/munmap through libc's entries,
 *                                detach, the same again, while a thread does the same all
 *                                along: every unmap must succeed (no ENOSYS: a large free
 *                                would leak), no crash
 *   uprobe_entry plain_mmap N    the same with the probe on mmap (glibc's __mmap)
 *   uprobe_entry verbs_munmap N  fake provider: a registration cached idle, the probe
 *                                attached, the buffer unmapped through libc's entry and
 *                                mapped again (raw system call), registered again: never a
 *                                hit; then detach, the same again; N rounds. A kept buffer's
 *                                registrations after the first must be hits, with the probe
 *                                attached too (caching goes on)
 *   uprobe_entry verbs_mmap N    the same with the remap by MAP_FIXED through libc's mmap
 *   uprobe_entry entry_NAME N    no verbs: the probe on NAME (madvise, mprotect, mremap, brk,
 *                                sbrk, shmat, shmdt), N rounds of attach, calls through
 *                                libc's entry, detach, calls again: each call's result must
 *                                be libc's (mremap's and sbrk's hooks are entered through a
 *                                trampoline that takes back the kept instruction)
 * exit 0: held; 1: broken (printed); 3: set-up failed; 77: skipped (printed: why). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <link.h>
#include <malloc.h>
#include <pthread.h>
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fake_hit.h"

static void *(*libc_mmap)(void *, size_t, int, int, int, off_t);
static int (*libc_munmap)(void *, size_t);

/* The file offset of `addr` in the object that holds it (its PT_LOAD's p_offset). */
static uintptr_t want_addr, found_off;
static int phdr_cb(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size, (void)data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *p = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + p->p_vaddr;
        if (p->p_type == PT_LOAD && want_addr >= lo && want_addr < lo + p->p_memsz) {
            found_off = want_addr - lo + p->p_offset;
            return 1;
        }
    }
    return 0;
}

static int uprobe_type(void) {
    FILE *f = fopen("/sys/bus/event_source/devices/uprobe/type", "r");
    int t = -1;
    if (!f) return -1;
    if (fscanf(f, "%d", &t) != 1) t = -1;
    fclose(f);
    return t;
}

static char libc_path[4096];

/* A uprobe on the entry `f` (in libc_path), this process only: its descriptor. Exits 77
 * where the kernel has no uprobe PMU or refuses. */
static int attach(void *f) {
    int type = uprobe_type();
    if (type < 0) {
        printf("uprobe_entry: skipped: no uprobe PMU (/sys/bus/event_source/devices/uprobe/type)\n");
        exit(77);
    }
    want_addr = (uintptr_t)f;
    found_off = 0;
    if (!dl_iterate_phdr(phdr_cb, NULL)) exit(3);
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = type;
    a.config1 = (uint64_t)(uintptr_t)libc_path;
    a.config2 = found_off;
    int fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) {
        printf("uprobe_entry: skipped: perf_event_open(uprobe %s+%#lx): %s\n", libc_path,
               (unsigned long)found_off, strerror(errno));
        exit(77);
    }
    if (*(volatile unsigned char *)f != 0xcc) {
        fprintf(stderr, "uprobe_entry: the probe is attached but the entry's first byte is %#x, not int3\n",
                *(volatile unsigned char *)f);
        exit(3);
    }
    return fd;
}

/* Large blocks malloc'ed and freed (glibc's own __mmap and __munmap), then mapped and
 * unmapped through libc's entries: how many of n unmaps failed (ENOSYS: the block leaks). */
static int leaked(int n) {
    int failed = 0;
    for (int i = 0; i < n; i++) {
        char *p = malloc(1 << 20);
        if (!p) exit(3);
        memset(p, 1, 4096);
        free(p);
        void *q = libc_mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (q == MAP_FAILED) exit(3);
        failed += libc_munmap(q, 1 << 20) != 0;
    }
    return failed;
}

static volatile int churn_stop;
static int churn_leaked, churn_blocks;

/* malloc/free of large blocks until told to stop, while the main thread attaches and
 * detaches: calls that trap, run out of line, and cross the byte written back. */
static void *churn(void *arg) {
    (void)arg;
    while (!churn_stop) {
        churn_leaked += leaked(1);
        churn_blocks++;
    }
    return NULL;
}

static int plain(void *f, int rounds) {
    /* A fixed threshold: every block of 1 MiB is mapped and unmapped (no dynamic raise). */
    mallopt(M_MMAP_THRESHOLD, 64 << 10);
    pthread_t t;
    if (pthread_create(&t, NULL, churn, NULL)) return 3;
    int bad = 0;
    for (int r = 0; r < rounds; r++) {
        int fd = attach(f);
        bad += leaked(4);
        close(fd);
        bad += leaked(4);
    }
    churn_stop = 1;
    pthread_join(t, NULL);
    printf("uprobe_entry plain: %d rounds of attach, malloc/free, detach, malloc/free: %d of %d unmaps failed; "
           "a thread meanwhile: %d of %d\n",
           rounds, bad, rounds * 8, churn_leaked, churn_blocks);
    return bad != 0 || churn_leaked != 0;
}

/* The buffer at b (LEN) replaced: through libc's munmap, then a raw mmap (no hook) at the
 * same place; or through libc's mmap with MAP_FIXED. */
static void replace(char *b, int by_mmap) {
    if (by_mmap) {
        if (libc_mmap(b, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != b)
            exit(3);
        return;
    }
    if (libc_munmap(b, LEN)) {
        fprintf(stderr, "uprobe_entry: libc's munmap failed: %s\n", strerror(errno));
        exit(1);
    }
    if ((char *)syscall(SYS_mmap, b, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != b)
        exit(3);
}

static int verbs(void *f, int by_mmap, int rounds) {
    static struct ibv_context ctx;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    char *b = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) return 3;
    int stale = 0, hits = 0, tries = 0;
    for (int r = 0; r < rounds; r++) {
        for (int attached = 1; attached >= 0; attached--) {
            /* Cached idle; the next cycles, before and after the probe is attached, are hits
             * while the cache caches (a breakpoint on the entry is no overwrite). */
            struct ibv_mr *cached = cycle(b);
            hits += cycle(b) == cached;
            int fd = attached ? attach(f) : -1;
            hits += cycle(b) == cached;
            replace(b, by_mmap);
            struct ibv_mr *mr = cycle(b);
            tries++;
            if (mr == cached) {
                stale++;
                fprintf(stderr, "uprobe_entry: round %d (%s): a stale registration was served\n", r,
                        attached ? "probe attached" : "probe detached");
            }
            if (fd >= 0) close(fd);
        }
    }
    printf("uprobe_entry verbs: %d of %d registrations after a replace were stale hits; %d of %d re-registrations of a kept buffer "
           "(a quarter with the probe attached) were hits\n",
           stale, tries, hits, 2 * tries);
    if (hits != 2 * tries) fprintf(stderr, "uprobe_entry: the cache stopped caching (a breakpoint taken for an overwrite?)\n");
    return stale != 0 || hits != 2 * tries;
}

/* Calls of `name` through libc's entry `f`, each checked: how many gave a wrong result. */
static int exercise(const char *name, void *f) {
    void *libc = dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY);
    void *(*sbrk_)(intptr_t) = dlsym(libc, "sbrk");
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        char *p = libc_mmap(NULL, 2 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) exit(3);
        p[0] = 1;
        if (!strcmp(name, "madvise")) {
            bad += ((int (*)(void *, size_t, int))f)(p, 4096, MADV_DONTNEED) != 0 || p[0] != 0;
        } else if (!strcmp(name, "mprotect")) {
            bad += ((int (*)(void *, size_t, int))f)(p, 4096, PROT_READ) != 0;
            bad += ((int (*)(void *, size_t, int))f)(p, 4096, PROT_READ | PROT_WRITE) != 0;
            p[0] = 2;
        } else if (!strcmp(name, "mremap")) {
            char *q = ((void *(*)(void *, size_t, size_t, int, ...))f)(p, 2 << 20, 4096, 0);
            bad += q != p || p[0] != 1;
        } else if (!strcmp(name, "sbrk")) {
            char *a = ((void *(*)(intptr_t))f)(0), *b = ((void *(*)(intptr_t))f)(4096);
            bad += a == (void *)-1 || b != a || ((void *(*)(intptr_t))f)(0) != a + 4096;
            bad += ((void *(*)(intptr_t))f)(-4096) != a + 4096 || ((void *(*)(intptr_t))f)(0) != a;
        } else if (!strcmp(name, "brk")) {
            char *a = sbrk_(0);
            bad += ((int (*)(void *))f)(a + 4096) != 0 || sbrk_(0) != a + 4096;
            bad += ((int (*)(void *))f)(a) != 0 || sbrk_(0) != a;
        } else if (!strcmp(name, "shmat") || !strcmp(name, "shmdt")) {
            int id = shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600);
            if (id < 0) exit(3);
            void *(*at)(int, const void *, int) = dlsym(libc, "shmat");
            int (*dt)(const void *) = dlsym(libc, "shmdt");
            char *m = at(id, NULL, 0);
            bad += m == (void *)-1;
            if (m != (void *)-1) {
                m[0] = 3;
                bad += dt(m) != 0;
            }
            shmctl(id, IPC_RMID, NULL);
        }
        if (libc_munmap(p, 2 << 20)) exit(3);
    }
    return bad;
}

static int entry(const char *name, int rounds) {
    void *f = dlsym(dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY), name);
    if (!f) return 3;
    int bad = 0;
    for (int r = 0; r < rounds; r++) {
        int fd = attach(f);
        bad += exercise(name, f);
        close(fd);
        bad += exercise(name, f);
    }
    printf("uprobe_entry %s: %d rounds of attach, calls, detach, calls: %d of %d calls wrong\n", name, rounds, bad,
           rounds * 8);
    return bad != 0;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    int rounds = atoi(argv[2]);
    void *libc = dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY);
    libc_mmap = dlsym(libc, "mmap");
    libc_munmap = dlsym(libc, "munmap");
    Dl_info info;
    if (!libc_mmap || !libc_munmap || !dladdr((void *)libc_munmap, &info) || !realpath(info.dli_fname, libc_path))
        return 3;
    const char *want = getenv("UPROBE_LIBC");
    if (!want || strcmp(want, libc_path)) {
        fprintf(stderr, "uprobe_entry: libc is %s, not the private copy %s\n", libc_path, want ? want : "(unset)");
        return 3;
    }
    const char *how = argv[1];
    int on_mmap = strstr(how, "mmap") && !strstr(how, "munmap");
    void *f = on_mmap ? (void *)libc_mmap : (void *)libc_munmap;
    if (!strncmp(how, "plain_", 6)) return plain(f, rounds);
    if (!strncmp(how, "verbs_", 6)) return verbs(f, on_mmap, rounds);
    if (!strncmp(how, "entry_", 6)) return entry(how + 6, rounds);
    return 2;
}
