/* Never a stale registration: for each way a buffer's memory can go away, register the
 * buffer (the cache keeps the registration idle after ibv_dereg_mr), make the same virtual
 * address be backed by new pages, register it again and prove with an RDMA WRITE that the
 * data reaches the NEW pages. A cache that missed the change hands back the old
 * registration, the write lands in the old pages, and the check fails.
 *
 *   stale SCENARIO    (see the table at the end; "list" prints the names)
 */
#include "lib/loopback.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <malloc.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <unistd.h>
#include <sys/syscall.h>

/* The scenarios reuse addresses after free/realloc on purpose: that is the hazard. */
#pragma GCC diagnostic ignored "-Wuse-after-free"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
#define MIB (1ul << 20)

static struct loopback lb;
static unsigned seed = 1;

/* Register [buf, buf+len), prove it, release it: the cache now holds it idle. */
static void warm(void *buf, size_t len) {
    struct ibv_mr *mr = ibv_reg_mr(lb.pd, buf, len, ACCESS);
    CHECK(mr, "ibv_reg_mr(%p, %zu): %s", buf, len, strerror(errno));
    CHECK(lb_prove_write(&lb, mr, buf, len, seed++) == 0, "first registration must work");
    CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
}

/* The memory under buf was replaced: a new registration must reach the new pages. */
static int fresh(void *buf, size_t len) {
    struct ibv_mr *mr = ibv_reg_mr(lb.pd, buf, len, ACCESS);
    CHECK(mr, "ibv_reg_mr(%p, %zu) after the change: %s", buf, len, strerror(errno));
    int rc = lb_prove_write(&lb, mr, buf, len, seed++);
    CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
    return rc;
}

static void *map(size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED, "mmap %zu: %s", len, strerror(errno));
    memset(p, 0x11, len);
    return p;
}

/* New anonymous memory exactly at p, without replacing anything (so no unmap happens
 * here: the scenario's own operation is the only thing the cache can learn from). */
static void map_at(void *p, size_t len, int extra) {
    void *q = mmap(p, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE | extra, -1, 0);
    CHECK(q == p, "new mapping at %p: got %p (%s)", p, q, q == MAP_FAILED ? strerror(errno) : "elsewhere");
    memset(p, 0x22, len);
}

static int s_munmap(void) {
    size_t len = 2 * MIB;
    char *p = map(len);
    warm(p, len);
    CHECK(munmap(p, len) == 0, "munmap");
    map_at(p, len, 0);
    return fresh(p, len);
}

static int s_munmap_partial(void) {
    size_t len = 2 * MIB;
    char *p = map(len);
    warm(p, len);
    CHECK(munmap(p + MIB / 2, MIB / 2) == 0, "munmap of the middle");
    map_at(p + MIB / 2, MIB / 2, 0);
    return fresh(p, len);
}

static int s_map_fixed(void) {
    size_t len = 2 * MIB;
    char *p = map(len);
    warm(p, len);
    void *q = mmap(p, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    CHECK(q == p, "MAP_FIXED");
    return fresh(p, len);
}

static int s_madvise_dontneed(void) {
    size_t len = 2 * MIB;
    char *p = map(len);
    warm(p, len);
    CHECK(madvise(p, len, MADV_DONTNEED) == 0, "madvise");
    return fresh(p, len);
}

static int s_mremap(void) {
    size_t len = 2 * MIB;
    char *p = map(len);
    char *target = map(len); /* somewhere to move to */
    warm(p, len);
    void *q = mremap(p, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, target);
    CHECK(q == target, "mremap away: %s", strerror(errno));
    map_at(p, len, 0);
    return fresh(p, len);
}

static int free_malloc_then(void (*before_free)(void)) {
    size_t len = 40 * MIB; /* above glibc's largest mmap threshold: its own mapping */
    char *p = malloc(len);
    memset(p, 0x11, len);
    /* Register whole pages past the first: allocators may place a block at a small
     * (random, for jemalloc) offset into its first page, where their headers live. */
    uintptr_t base = ((uintptr_t)p & ~4095ul) + 4096;
    size_t rlen = len - 4096;
    warm((void *)base, rlen);
    if (before_free)
        before_free();
    free(p);
    char *q = malloc(len);
    CHECK((((uintptr_t)q & ~4095ul) + 4096) == base, "malloc after free returned %p, not the same pages", (void *)q);
    memset(q, 0x22, len);
    int rc = fresh((void *)base, rlen);
    free(q);
    return rc;
}

static int s_free_malloc(void) { return free_malloc_then(NULL); }

static int s_realloc(void) {
    size_t len = 40 * MIB;
    char *p = malloc(len);
    memset(p, 0x11, len);
    /* A page right after the chunk keeps realloc from growing it in place (usually the
     * previous mapping is there already: EEXIST). */
    size_t chunk_end = ((uintptr_t)p + malloc_usable_size(p) + 4095) & ~4095ul;
    void *blocker = mmap((void *)chunk_end, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(blocker == (void *)chunk_end || errno == EEXIST, "blocker page after the chunk: %s", strerror(errno));
    warm(p, len);
    uintptr_t was = (uintptr_t)p;
    char *q = realloc(p, 2 * len);
    CHECK(q && (uintptr_t)q != was, "realloc did not move the block");
    /* The old range is empty now; map new memory there (the chunk's page-aligned span). */
    char *old = (char *)((was - 16) & ~4095ul);
    map_at(old, chunk_end - (uintptr_t)old, 0);
    int rc = fresh((char *)was, len);
    free(q);
    if (blocker == (void *)chunk_end)
        munmap(blocker, 4096);
    return rc;
}

/* A block at the top of glibc's brk heap, freed: malloc trims the heap through libc's own
 * __sbrk (which UCX's bistro replaces with a brk system call of its own), and the next
 * block at that address is new memory. */
static int s_heap_trim(void) {
    mallopt(M_MMAP_THRESHOLD, 16 * MIB);
    mallopt(M_TRIM_THRESHOLD, 128 * 1024);
    mallopt(M_TOP_PAD, 0);
    /* Room below the block for the small allocations made while it is registered (the
     * provider's MR), which would otherwise sit above it and keep the heap from shrinking;
     * the fence keeps that room from merging with the top. */
    char *room = malloc(MIB);
    CHECK(room, "malloc");
    /* The fence must sit above the room: a small chunk some library freed earlier (malloc's
     * tcache, a bin) would serve it from below, the room would merge with the top when freed,
     * and the small allocations would come from above the block (seen in the aarch64 guest:
     * "free() never trimmed the heap"). */
    char *fence;
    do
        fence = malloc(64);
    while (fence && fence < room + MIB);
    CHECK(fence, "malloc");
    free(room);
    size_t len = 4 * MIB;
    char *p = NULL, *held[4] = {NULL};
    uintptr_t base = 0;
    size_t rlen = len - 2 * 4096;
    /* A block from a free chunk inside the heap is not trimmed when freed: hold that chunk
     * and take the next block, until one comes from the top. */
    for (int i = 0; i <= 4; i++) {
        CHECK(i < 4, "free() never trimmed the heap: no block came from its top");
        p = malloc(len);
        CHECK(p, "malloc %zu", len);
        memset(p, 0x11, len);
        base = ((uintptr_t)p & ~4095ul) + 4096;
        warm((void *)base, rlen);
        char *top = sbrk(0);
        free(p);
        if ((char *)sbrk(0) < top - MIB)
            break;
        held[i] = malloc(len);
    }
    char *q = malloc(len);
    CHECK(q == p, "malloc after the trim returned %p, not %p", (void *)q, (void *)p);
    memset(q, 0x22, len);
    int rc = fresh((void *)base, rlen);
    free(q);
    for (int i = 0; i < 4; i++)
        free(held[i]);
    return rc;
}

static int s_sbrk(void) {
    /* Keep malloc off the break while we move it: a big free top chunk, never trimmed. */
    mallopt(M_MMAP_THRESHOLD, 64 * MIB);
    mallopt(M_TRIM_THRESHOLD, 256 * MIB);
    free(malloc(16 * MIB));
    size_t len = MIB;
    char *p = sbrk(0);
    CHECK(sbrk(len) == p, "sbrk grow");
    memset(p, 0x11, len);
    warm(p, len);
    CHECK(sbrk(-(intptr_t)len) != (void *)-1, "sbrk shrink");
    CHECK(sbrk(len) == p, "sbrk regrow");
    memset(p, 0x22, len);
    int rc = fresh(p, len);
    sbrk(-(intptr_t)len);
    return rc;
}

/* remap_file_pages: since Linux 4.0 the kernel emulates it as mmap(MAP_FIXED)
 * of the same file over the range, which then shows the file's other pages. */
static int s_remap_file_pages(void) {
    size_t len = 2 * MIB;
    int fd = memfd_create("stale_remap_file_pages", 0);
    CHECK(fd >= 0 && ftruncate(fd, (off_t)(2 * len)) == 0, "memfd: %s", strerror(errno));
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(p != MAP_FAILED, "mmap of the memfd: %s", strerror(errno));
    close(fd);
    memset(p, 0x11, len);
    warm(p, len);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    CHECK(remap_file_pages(p, len, 0, len / 4096, 0) == 0, "remap_file_pages: %s", strerror(errno));
#pragma GCC diagnostic pop
    memset(p, 0x22, len);
    int rc = fresh(p, len);
    munmap(p, len);
    return rc;
}

static int s_shm(void) {
    size_t len = 2 * MIB;
    int a = shmget(IPC_PRIVATE, len, IPC_CREAT | 0600), b = shmget(IPC_PRIVATE, len, IPC_CREAT | 0600);
    CHECK(a >= 0 && b >= 0, "shmget: %s", strerror(errno));
    char *p = shmat(a, NULL, 0);
    CHECK(p != (void *)-1, "shmat");
    memset(p, 0x11, len);
    warm(p, len);
    CHECK(shmdt(p) == 0, "shmdt");
    char *q = shmat(b, p, 0);
    CHECK(q == p, "second segment at the same address: %p", (void *)q);
    int rc = fresh(q, len);
    shmdt(q);
    shmctl(a, IPC_RMID, NULL);
    shmctl(b, IPC_RMID, NULL);
    return rc;
}

static char *aligned_map(size_t len, size_t align) {
    char *raw = mmap(NULL, len + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(raw != MAP_FAILED, "mmap");
    char *p = (char *)(((uintptr_t)raw + align - 1) & ~(align - 1));
    return p;
}

static int s_thp(void) {
    size_t len = 4 * MIB;
    char *p = aligned_map(len, 2 * MIB);
    CHECK(madvise(p, len, MADV_HUGEPAGE) == 0, "MADV_HUGEPAGE: %s", strerror(errno));
    memset(p, 0x11, len);
    warm(p, len);
    CHECK(madvise(p, len, MADV_DONTNEED) == 0, "madvise");
    return fresh(p, len);
}

static int s_hugetlb(void) {
    size_t len = 4 * MIB;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    CHECK(p != MAP_FAILED, "MAP_HUGETLB: %s (configure hugepages: vm.nr_hugepages)", strerror(errno));
    memset(p, 0x11, len);
    warm(p, len);
    CHECK(munmap(p, len) == 0, "munmap");
    map_at(p, len, MAP_HUGETLB);
    return fresh(p, len);
}

/* MAP_FIXED|MAP_HUGETLB of ONE small page over ordinary memory: the kernel rounds the
 * length up to the huge page size and replaces the whole 2 MiB. */
static int s_hugetlb_fixed_short(void) {
    char *p = aligned_map(2 * MIB, 2 * MIB);
    memset(p, 0x11, 2 * MIB);
    char *buf = p + MIB;
    warm(buf, MIB);
    void *q = mmap(p, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_HUGETLB, -1, 0);
    CHECK(q == p, "MAP_FIXED|MAP_HUGETLB: %s", strerror(errno));
    memset(buf, 0x22, MIB);
    return fresh(buf, MIB);
}

/* A System V hugetlb segment of one small page is mapped as a whole huge page. */
static int s_shm_hugetlb_short(void) {
    int a = shmget(IPC_PRIVATE, 4096, IPC_CREAT | SHM_HUGETLB | 0600);
    CHECK(a >= 0, "shmget SHM_HUGETLB: %s", strerror(errno));
    char *p = shmat(a, NULL, 0);
    CHECK(p != (void *)-1, "shmat: %s", strerror(errno));
    char *buf = p + MIB;
    memset(buf, 0x11, MIB);
    warm(buf, MIB);
    CHECK(shmdt(p) == 0, "shmdt");
    shmctl(a, IPC_RMID, NULL);
    map_at(p, 2 * MIB, 0);
    return fresh(buf, MIB);
}

static int s_cycle(void) {
    enum { N = 100 };
    char *b[N];
    int bad = 0;
    /* A fixed threshold: every block is its own mapping, unmapped by free. */
    mallopt(M_MMAP_THRESHOLD, 256 << 10);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            size_t len = MIB / 2 + (size_t)i * 4096; /* mmapped by glibc at the default threshold */
            b[i] = malloc(len);
            memset(b[i], round, len);
            struct ibv_mr *mr = ibv_reg_mr(lb.pd, b[i], len, ACCESS);
            CHECK(mr, "ibv_reg_mr");
            if (lb_prove_write(&lb, mr, b[i], len, seed++))
                bad++;
            CHECK(ibv_dereg_mr(mr) == 0, "dereg");
        }
        for (int i = 0; i < N; i++)
            free(b[i]);
    }
    printf("cycle: %d stale registrations in 300\n", bad);
    return bad ? -1 : 0;
}

/* A thread arena's heap shrinks under the buffer and grows back: glibc's shrink_heap gives
 * the pages back with its internal __madvise(MADV_DONTNEED), or, when it reads
 * vm.overcommit_memory=2, with its internal __mmap(PROT_NONE, MAP_FIXED); growing again
 * maps fresh zero pages at the same addresses. */
static char *arena_block;

static void *arena_fill(void *value) {
    arena_block = malloc(4 * MIB); /* below the mmap threshold set below: in the heap */
    CHECK(arena_block, "malloc");
    memset(arena_block, (int)(intptr_t)value, 4 * MIB);
    return NULL;
}

/* Allocate from a new thread: its own arena the first time; the second time the same
 * arena, which a finished thread leaves on glibc's free list for the next new thread. */
static void arena_fill_in_thread(int value) {
    pthread_t t;
    CHECK(pthread_create(&t, NULL, arena_fill, (void *)(intptr_t)value) == 0, "pthread_create");
    CHECK(pthread_join(t, NULL) == 0, "pthread_join");
}

static void *no_alloc(void *arg) { return arg; }

/* A thread that allocates nothing (takes no arena). */
static void thread_without_arena(void) {
    pthread_t t;
    CHECK(pthread_create(&t, NULL, no_alloc, NULL) == 0, "pthread_create");
    CHECK(pthread_join(t, NULL) == 0, "pthread_join");
}

static int s_arena_shrink(void) {
    mallopt(M_MMAP_THRESHOLD, 32 * MIB);
    /* mrcache starts its drain thread at the first registration after the program has had
     * a thread: let that be now, so its arena is a new one, not the one the first filler
     * leaves on glibc's free list for the second. */
    static char page[4096] __attribute__((aligned(4096)));
    thread_without_arena();
    warm(page, sizeof page);
    arena_fill_in_thread(0x11);
    char *first = arena_block;
    /* Past the top pad glibc keeps (128 KiB), inside the block (its header untouched). */
    char *base = (char *)(((uintptr_t)first + MIB) & ~4095ul);
    size_t len = 2 * MIB;
    warm(base, len);
    free(arena_block); /* the top chunk now spans the block: the heap is trimmed */
    arena_fill_in_thread(0x22);
    CHECK(arena_block == first, "the second thread got another arena (%p, was %p)", (void *)arena_block, (void *)first);
    int rc = fresh(base, len);
    free(arena_block);
    return rc;
}

/* Another library overwrites libc's munmap entry after mrcache patched it (as UCX, Open
 * MPI or a profiler would): tests/c/guest/so/patcher.c, next to this program, loaded after the
 * cache is running. Then free() of an mmapped block must still never give a stale hit. */
static int s_free_malloc_repatched(void) {
    char exe[PATH_MAX], lib[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    CHECK(n > 0, "readlink /proc/self/exe");
    exe[n] = 0;
    *strrchr(exe, '/') = 0;
    snprintf(lib, sizeof lib, "%s/libpatcher.so", exe);
    size_t len = 2 * MIB;
    char *p = map(len);
    warm(p, len); /* the cache exists and has checked its patches */
    CHECK(dlopen(lib, RTLD_NOW), "dlopen %s: %s", lib, dlerror());
    munmap(p, len);
    return s_free_malloc();
}

static int transient_munmap(void *addr, size_t len) { return (int)syscall(SYS_munmap, addr, len); }
static void entry_write(unsigned char *f, const unsigned char *code, size_t n) {
    uintptr_t page = (uintptr_t)f & ~4095ul;
    CHECK(syscall(SYS_mprotect, page, 8192, PROT_READ | PROT_WRITE | PROT_EXEC) == 0, "mprotect");
    memcpy(f, code, n);
    __builtin___clear_cache((char *)f, (char *)f + n); /* aarch64: instruction fetch sees it */
    syscall(SYS_mprotect, page, 8192, PROT_READ | PROT_EXEC);
}

/* A patcher that overwrites the entry of every loaded definition of munmap (libfabric's
 * memhooks walks the objects with dl_iterate_phdr): with the preload, the definition the
 * global scope finds is mrcache's own hook, which libc's patched entry jumps to. */
static void overwrite_our_munmap(void) {
    unsigned char *f = dlsym(RTLD_DEFAULT, "munmap");
    CHECK(f, "munmap");
    uint64_t hook = (uint64_t)(uintptr_t)transient_munmap;
#if defined(__aarch64__)
    /* ldr x16, #8; br x16; .quad hook (x16: a BTI `bti c` landing pad accepts it) */
    unsigned char code[16] = {0x50, 0x00, 0x00, 0x58, 0x00, 0x02, 0x1f, 0xd6};
    memcpy(code + 8, &hook, 8);
#else
    unsigned char code[13] = {0x49, 0xbb};
    memcpy(code + 2, &hook, 8);
    code[10] = 0x41, code[11] = 0xff, code[12] = 0xe3;
#endif
    entry_write(f, code, sizeof code);
    usleep(100000); /* several of mrcache's drain cycles: time to notice, if it looks */
}

static int s_free_malloc_hook_patched(void) { return free_malloc_then(overwrite_our_munmap); }

static const struct {
    const char *name;
    int (*run)(void);
} scenarios[] = {
    {"munmap", s_munmap},
    {"munmap_partial", s_munmap_partial},
    {"map_fixed", s_map_fixed},
    {"madvise_dontneed", s_madvise_dontneed},
    {"mremap", s_mremap},
    {"free_malloc", s_free_malloc},
    {"realloc", s_realloc},
    {"sbrk", s_sbrk},
    {"heap_trim", s_heap_trim},
    {"shm", s_shm},
    {"thp", s_thp},
    {"hugetlb", s_hugetlb},
    {"cycle", s_cycle},
    {"hugetlb_fixed_short", s_hugetlb_fixed_short},
    {"free_malloc_hook_patched", s_free_malloc_hook_patched},
    {"shm_hugetlb_short", s_shm_hugetlb_short},
    {"arena_shrink", s_arena_shrink},
    {"free_malloc_repatched", s_free_malloc_repatched},
    {"remap_file_pages", s_remap_file_pages},
};

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: stale SCENARIO (or list)");
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++) {
        if (!strcmp(argv[1], "list")) {
            printf("%s\n", scenarios[i].name);
            continue;
        }
        if (strcmp(argv[1], scenarios[i].name))
            continue;
        CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
        int rc = scenarios[i].run();
        lb_close(&lb);
        printf("stale %s: %s\n", argv[1], rc ? "STALE registration: data went to the old pages" : "ok");
        return rc ? 1 : 0;
    }
    if (!strcmp(argv[1], "list"))
        return 0;
    CHECK(0, "unknown scenario %s", argv[1]);
}
