/* A library in the program's DT_NEEDED list whose constructor starts threads before
 * libmrcache.so's constructor runs (the loader initialises it first, as it does
 * LTTng-UST, C++ static threads and thread pools). Each thread loops on one of the libc
 * calls whose entry mrcache patches, through libc's own entry point (found with dlsym in
 * libc's handle, so the thread runs exactly the bytes being patched). The program's main
 * lets them run on, then stops and joins them (hammer_stop). With HAMMER_LATE set, main
 * starts them (hammer_begin) instead. HAMMER_ONLY=NAME runs one call's thread only.
 * Built into libpatch_hammer.so. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <limits.h>
#include <link.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <string.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define BIG (256ul << 10)
enum { MUNMAP, MADVISE, MMAP, MREMAP, BRK, SBRK, SHM, CALLS };
static const char *names[CALLS] = {"munmap", "madvise", "mmap", "mremap", "brk", "sbrk", "shmat"};
static void *entry[CALLS + 1];
static pthread_t threads[CALLS];
static atomic_int running, stop;
static atomic_long rounds[CALLS];

static void *hammer(void *arg) {
    long which = (long)arg;
    int (*mu)(void *, size_t) = entry[MUNMAP];
    int (*ma)(void *, size_t, int) = entry[MADVISE];
    void *(*mm)(void *, size_t, int, int, int, off_t) = entry[MMAP];
    void *(*mr)(void *, size_t, size_t, int, ...) = entry[MREMAP];
    int (*br)(void *) = entry[BRK];
    void *(*sb)(intptr_t) = entry[SBRK];
    void *(*sa)(int, const void *, int) = entry[SHM];
    int (*sd)(const void *) = entry[CALLS];
    char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *big = mmap(NULL, BIG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int shm = which == SHM ? shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600) : -1;
    if (shm >= 0) {
        void *probe = shmat(shm, NULL, 0);
        shmctl(shm, IPC_RMID, NULL); /* gone at the last detach, even if we crash */
        if (probe != (void *)-1) shmdt(probe);
    }
    atomic_fetch_add(&running, 1);
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        switch (which) {
        /* Long system calls (pages populated and freed in the kernel): a thread is most
         * likely inside one, to return to the instruction after its `syscall`. */
        case MUNMAP: {
            char *p = mmap(NULL, BIG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
            if (p == MAP_FAILED || mu(p, BIG)) abort();
            break;
        }
        case MADVISE:
            if (ma(big, BIG, MADV_POPULATE_WRITE) && ma(big, BIG, MADV_WILLNEED)) abort();
            if (ma(big, BIG, MADV_DONTNEED)) abort();
            break;
        case MMAP: {
            char *p = mm(NULL, BIG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
            if (p == MAP_FAILED) abort();
            munmap(p, BIG);
            break;
        }
        case MREMAP: {
            char *p = mr(page, 4096, 4096, 0);
            if (p == MAP_FAILED) abort();
            break;
        }
        case BRK: br(NULL); break; /* asks only (a brk to where it was races malloc) */
        case SBRK: sb(0); break;
        case SHM: {
            void *p = sa(shm, NULL, 0);
            if (p != (void *)-1) sd(p);
            break;
        }
        }
        atomic_fetch_add_explicit(&rounds[which], 1, memory_order_relaxed);
    }
    return NULL;
}

/* libc's definition of `name`, read from its dynamic symbol table: not with dlsym, which
 * libmrcache.so interposes (and which makes it patch at once, before our threads run). */
static ElfW(Addr) libc_base;
static const ElfW(Sym) *libc_syms;
static const char *libc_strs;
static uint32_t libc_nsyms;

static int find_libc(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size, (void)data;
    if (!strstr(info->dlpi_name, "/libc.so.6")) return 0;
    libc_base = info->dlpi_addr;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        if (info->dlpi_phdr[i].p_type != PT_DYNAMIC) continue;
        const uint32_t *gnu_hash = NULL;
        for (const ElfW(Dyn) *d = (const void *)(libc_base + info->dlpi_phdr[i].p_vaddr); d->d_tag != DT_NULL; d++) {
            if (d->d_tag == DT_SYMTAB) libc_syms = (const void *)d->d_un.d_ptr;
            if (d->d_tag == DT_STRTAB) libc_strs = (const void *)d->d_un.d_ptr;
            if (d->d_tag == DT_GNU_HASH) gnu_hash = (const void *)d->d_un.d_ptr;
        }
        if (!gnu_hash) abort();
        /* The symbol count: past the highest bucket, to the end of its chain. */
        uint32_t nbuckets = gnu_hash[0], base = gnu_hash[1], bloom = gnu_hash[2];
        const uint32_t *buckets = gnu_hash + 4 + bloom * (sizeof(ElfW(Addr)) / 4);
        const uint32_t *chain = buckets + nbuckets;
        uint32_t last = 0;
        for (uint32_t b = 0; b < nbuckets; b++)
            if (buckets[b] > last) last = buckets[b];
        if (last)
            while (!(chain[last - base] & 1)) last++;
        libc_nsyms = last + 1;
    }
    return 1;
}

static void *libc_symbol(const char *name) {
    for (uint32_t i = 0; i < libc_nsyms; i++)
        if (libc_syms[i].st_value && ELF64_ST_TYPE(libc_syms[i].st_info) == STT_FUNC &&
            !strcmp(libc_strs + libc_syms[i].st_name, name))
            return (void *)(libc_base + libc_syms[i].st_value);
    return NULL;
}

/* Starts the threads (from the constructor, or from main with HAMMER_LATE set). */
void hammer_begin(void) {
    /* glibc's brk(), even brk(NULL), stores the kernel's break in __curbrk; racing malloc's
     * own sbrk (growing or trimming the heap) it can move __curbrk back, and malloc aborts
     * ("break adjusted to free malloc space", seen once in 200 runs). From here on malloc
     * takes memory with mmap only and never trims, so the BRK thread races nothing. */
    if (!mallopt(M_MMAP_THRESHOLD, 0) || !mallopt(M_TRIM_THRESHOLD, INT_MAX)) abort();
    dl_iterate_phdr(find_libc, NULL);
    for (int i = 0; i < CALLS; i++)
        if (!(entry[i] = libc_symbol(names[i]))) abort();
    if (!(entry[CALLS] = libc_symbol("shmdt"))) abort();
    const char *only = getenv("HAMMER_ONLY"); /* a comma-free single name, or all */
    for (long i = 0; i < CALLS; i++) {
        if (only && *only && strcmp(only, names[i])) continue;
        if (pthread_create(&threads[i], NULL, hammer, (void *)i)) abort();
    }
    int want = 0;
    for (int i = 0; i < CALLS; i++) want += !only || !*only || !strcmp(only, names[i]);
    while (atomic_load(&running) < want) sched_yield();
}

__attribute__((constructor)) static void hammer_start(void) {
    if (!getenv("HAMMER_LATE")) hammer_begin();
}

/* Lets the threads go on for `more` more rounds each (past the constructors), then stops
 * and joins them; returns the rounds done in all. */
long hammer_stop(long more) {
    long total = 0;
    for (int i = 0; i < CALLS; i++) {
        if (!threads[i]) continue;
        long until = atomic_load(&rounds[i]) + more;
        while (atomic_load(&rounds[i]) < until) sched_yield();
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < CALLS; i++)
        if (threads[i]) {
            pthread_join(threads[i], NULL);
            total += rounds[i];
        }
    return total;
}
