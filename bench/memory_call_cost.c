/* What a memory call costs through whatever is preloaded: ROUNDS madvise(MADV_NORMAL) on
 * one page, and ROUNDS munmap(page, 0) (EINVAL: the hook's whole path, nothing unmapped).
 * Prints the best of 5 runs of each, in ns per call. With -DLIBC_ENTRY, through libc's own
 * entry points (what free() and malloc_trim reach: our patched jump when preloaded). Not a
 * test: docs/testing.md says how the numbers were taken. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <sys/mman.h>
#include <time.h>

#ifndef ROUNDS
#define ROUNDS 1000000
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(void) {
#ifdef LIBC_ENTRY
    void *libc = dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY);
    int (*madvise)(void *, size_t, int) = dlsym(libc, "madvise");
    int (*munmap)(void *, size_t) = dlsym(libc, "munmap");
    if (!madvise || !munmap) return 1;
#endif
    char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 1;
    double best_madvise = 1e18, best_munmap = 1e18;
    for (int run = 0; run < 5; run++) {
        double t = now();
        for (int i = 0; i < ROUNDS; i++)
            if (madvise(p, 4096, MADV_NORMAL)) return 1;
        double m = (now() - t) / ROUNDS;
        t = now();
        for (int i = 0; i < ROUNDS; i++)
            if (munmap(p, 0) == 0) return 1;
        double u = (now() - t) / ROUNDS;
        if (m < best_madvise) best_madvise = m;
        if (u < best_munmap) best_munmap = u;
    }
    printf("madvise(MADV_NORMAL): %.1f ns/call, munmap(p, 0): %.1f ns/call\n", best_madvise, best_munmap);
    return 0;
}
