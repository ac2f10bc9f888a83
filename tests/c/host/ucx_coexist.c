/* mrcache and UCX's memory hooks in one process, on the host (no RDMA): a fake provider
 * (ibv_context ops that count registrations), libmrcache.so preloaded, UCM's hooks
 * installed (ucx/ucm_watch.c). For one way memory goes away: register a buffer twice
 * (the second must be a hit: caching is on), release it, make the memory go away, register
 * again. mrcache saw it when the provider registers anew; UCX saw it when its VM_UNMAPPED
 * handler got an event for the range.
 *   ucx_coexist munmap|madvise|madvise_free|mremap|mremap_shrink|mmap_fixed|shmdt|free|
 *               heap_trim|nested
 * heap_trim: a buffer at the top of glibc's brk heap, freed: malloc trims the heap through
 * libc's own sbrk (which UCX's bistro replaces with a brk system call of its own).
 * nested: a second buffer is unmapped from inside UCX's handler for the first (a hook
 * calling back into an interposed symbol); that second unmap must reach both.
 * Built with -DLATE, the program is not linked with UCX: it dlopens libucm_watch.so (and
 * so libucm and libucs, whose constructors patch libc) from main, after libmrcache.so's
 * constructor, as Open MPI loads its UCX component.
 * Exit 0: both saw it; 1: mrcache did not; 2: UCX did not; 3: neither; 4: UCM would not
 * install; 5: caching was off. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <unistd.h>

#ifdef LATE
#include <dlfcn.h>
static char **w_lo, **w_hi, **w_nested_lo, **w_nested_hi;
static int *w_events, *w_nested_events;
static void (**w_inside)(void);
static int (*ucm_watch_install)(void);
#define ucm_watch_lo (*w_lo)
#define ucm_watch_hi (*w_hi)
#define ucm_watch_nested_lo (*w_nested_lo)
#define ucm_watch_nested_hi (*w_nested_hi)
#define ucm_watch_events (*w_events)
#define ucm_watch_nested_events (*w_nested_events)
#define ucm_watch_inside (*w_inside)
static void *watch_sym(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "FAIL: %s not in libucm_watch.so\n", name);
        exit(4);
    }
    return p;
}
static void load_watch(void) {
    void *h = dlopen("libucm_watch.so", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "FAIL: dlopen libucm_watch.so: %s\n", dlerror());
        exit(4);
    }
    w_lo = watch_sym(h, "ucm_watch_lo");
    w_hi = watch_sym(h, "ucm_watch_hi");
    w_nested_lo = watch_sym(h, "ucm_watch_nested_lo");
    w_nested_hi = watch_sym(h, "ucm_watch_nested_hi");
    w_events = watch_sym(h, "ucm_watch_events");
    w_nested_events = watch_sym(h, "ucm_watch_nested_events");
    w_inside = watch_sym(h, "ucm_watch_inside");
    *(void **)&ucm_watch_install = watch_sym(h, "ucm_watch_install");
}
#else
extern char *ucm_watch_lo, *ucm_watch_hi;
extern int ucm_watch_events;
extern char *ucm_watch_nested_lo, *ucm_watch_nested_hi;
extern int ucm_watch_nested_events;
extern void (*ucm_watch_inside)(void);
int ucm_watch_install(void);
static void load_watch(void) {}
#endif

static char *second;
static size_t second_len;
static void unmap_second(void) { munmap(second, second_len); }

/* Fake MRs from a static pool: a heap allocation above a heap_trim buffer would keep
 * free() from trimming the heap. */
static int registrations;
static struct {
    struct ibv_mr mr;
    char spare[64];
} fake_mrs[64];
static struct ibv_mr *fake_reg(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
    (void)pd, (void)addr, (void)len, (void)iova, (void)access;
    if (registrations == 64)
        return NULL;
    return &fake_mrs[registrations++].mr;
}
static int fake_dereg(struct ibv_mr *mr) {
    (void)mr;
    return 0;
}

static struct ibv_pd pd;

static void reg_release(void *buf, size_t len) {
    struct ibv_mr *mr = ibv_reg_mr(&pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
    if (!mr) {
        fprintf(stderr, "ibv_reg_mr failed\n");
        exit(6);
    }
    ibv_dereg_mr(mr);
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 7;
    static struct ibv_context ctx;
    ctx.ops._compat_reg_mr = (void *(*)(void))(void (*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))(void (*)(void))fake_dereg;
    pd.context = &ctx;
    load_watch();
    const char *early = getenv("UCM_WATCH_EARLY");
    if (!(early && *early == '1') && ucm_watch_install() != 0) {
        fprintf(stderr, "FAIL: UCM could not install its memory hooks\n");
        return 4;
    }
    const char *s = argv[1];
    size_t len = 1 << 20;
    int shmid = -1;
    char *buf;
    if (!strcmp(s, "shmdt")) {
        shmid = shmget(IPC_PRIVATE, len, IPC_CREAT | 0600);
        buf = shmat(shmid, NULL, 0);
    } else if (!strcmp(s, "free")) {
        len = 40 << 20; /* above glibc's mmap threshold: free() unmaps it inside libc */
        buf = malloc(len);
    } else if (!strcmp(s, "heap_trim")) {
        /* From the brk heap (below the mmap threshold), trimmed as soon as it is freed. */
        mallopt(M_MMAP_THRESHOLD, 16 << 20);
        mallopt(M_TRIM_THRESHOLD, 128 << 10);
        mallopt(M_TOP_PAD, 0);
        /* mrcache's start-up allocations first, so that none lands above the buffer. */
        char *scratch = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        reg_release(scratch, len);
        reg_release(scratch, len);
        buf = malloc(len);
    } else {
        buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (!buf || buf == MAP_FAILED)
        return 8;
    memset(buf, 1, len);
    ucm_watch_lo = buf;
    ucm_watch_hi = buf + len;
    reg_release(buf, len);
    int before = registrations;
    reg_release(buf, len);
    if (registrations != before) {
        printf("%s: caching is off (the second registration was not a hit)\n", s);
        return 5;
    }
    int nested = !strcmp(s, "nested");
    if (nested) {
        /* From here on the scenario is about the second buffer. */
        second_len = len;
        second = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (second == MAP_FAILED)
            return 8;
        memset(second, 2, len);
        reg_release(second, len);
        before = registrations;
        reg_release(second, len);
        if (registrations != before)
            return 5;
        ucm_watch_nested_lo = second;
        ucm_watch_nested_hi = second + len;
        ucm_watch_inside = unmap_second;
    }
    if (!strcmp(s, "munmap") || nested)
        munmap(buf, len);
    else if (!strcmp(s, "madvise"))
        madvise(buf, len, MADV_DONTNEED);
    else if (!strcmp(s, "madvise_free"))
        madvise(buf, len, MADV_FREE);
    else if (!strcmp(s, "mremap"))
        mremap(buf, len, 2 * len, MREMAP_MAYMOVE);
    else if (!strcmp(s, "mremap_shrink")) {
        mremap(buf, len, len / 2, 0); /* gives back the upper half */
    } else if (!strcmp(s, "mmap_fixed"))
        mmap(buf, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    else if (!strcmp(s, "shmdt")) {
        shmdt(buf);
        shmctl(shmid, IPC_RMID, NULL);
    } else if (!strcmp(s, "free"))
        free(buf);
    else if (!strcmp(s, "heap_trim")) {
        char *top = sbrk(0);
        free(buf);
        if ((char *)sbrk(0) >= top) {
            printf("%s: free() did not trim the heap (skipped)\n", s);
            return 9;
        }
    } else
        return 7;
    /* The same addresses again, without anything that unmaps (free: the fake provider
     * registers any range, and the block may already be reused). */
    if (nested) {
        buf = second;
        ucm_watch_events = ucm_watch_nested_events;
    }
    if (!strcmp(s, "free") || !strcmp(s, "heap_trim")) {
        /* Map back the pages free() gave back: mrcache passes a registration of memory
         * with no mapping to libibverbs (device memory), not to this fake provider. */
        unsigned char v;
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        for (char *p = (char *)((uintptr_t)buf & ~(uintptr_t)(page - 1)); p < buf + len; p += page)
            if (mincore(p, page, &v) && errno == ENOMEM &&
                mmap(p, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                     -1, 0) != p) {
                printf("%s: the range could not be mapped again (skipped)\n", s);
                return 9;
            }
    }
    size_t kept = strcmp(s, "mremap_shrink") ? 0 : len / 2; /* what stayed mapped */
    if (strcmp(s, "madvise") && strcmp(s, "madvise_free") && strcmp(s, "free") &&
        strcmp(s, "heap_trim") && strcmp(s, "mmap_fixed") &&
        mmap(buf + kept, len - kept, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) != buf + kept) {
        printf("%s: the range could not be mapped again (skipped)\n", s);
        return 9;
    }
    before = registrations;
    reg_release(buf, len);
    int mrcache_saw = registrations > before;
    int ucx_saw = ucm_watch_events > 0;
    printf("%s: mrcache %s, UCX %s (%d events)\n", s, mrcache_saw ? "saw it" : "MISSED",
           ucx_saw ? "saw it" : "MISSED", ucm_watch_events);
    return (mrcache_saw ? 0 : 1) | (ucx_saw ? 0 : 2);
}
