// Threads that allocate and free large blocks under jemalloc (preloaded, not linked), so
// jemalloc maps extents, purges freed ones with madvise and, with retain:false, unmaps them.
// jemalloc's mallctl is found with dlsym: the program says whether jemalloc is the
// allocator and whether it purged, never figures that depend on timing. Exit status 0, or 1
// with a line naming the check that failed.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 4
#define ROUNDS 25

typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);

static int failures;

static void *work(void *arg) {
    int id = (int)(intptr_t)arg;
    uint64_t h = 1469598103934665603ULL;
    for (int r = 0; r < ROUNDS; r++) {
        size_t sizes[4] = {(size_t)(1 + (r + id) % 8) << 20, 300000, 40000 + 4096 * (size_t)id,
                           (size_t)(2 + r % 3) << 20};
        unsigned char *p[4];
        for (int k = 0; k < 4; k++) {
            p[k] = malloc(sizes[k]);
            if (!p[k]) {
                fprintf(stderr, "thread %d: malloc %zu failed\n", id, sizes[k]);
                __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
                return NULL;
            }
            memset(p[k], (id * 16 + r + k) & 0xff, sizes[k]);
        }
        p[0] = realloc(p[0], sizes[0] * 2);  // grows a large extent (in place or moved)
        if (!p[0]) {
            fprintf(stderr, "thread %d: realloc failed\n", id);
            __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
            return NULL;
        }
        for (int k = 0; k < 4; k++) {
            for (size_t i = 0; i < sizes[k]; i += 4096)
                if (p[k][i] != ((id * 16 + r + k) & 0xff)) {
                    fprintf(stderr, "thread %d round %d block %d: byte %zu changed\n", id, r,
                            k, i);
                    __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
                    break;
                }
            h = (h ^ p[k][sizes[k] - 1]) * 1099511628211ULL;
            free(p[k]);
        }
    }
    return (void *)(uintptr_t)h;
}

int main(void) {
    mallctl_fn mallctl = (mallctl_fn)dlsym(RTLD_DEFAULT, "mallctl");
    printf("jemalloc: %s\n", mallctl ? "yes" : "no");
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, work, (void *)(intptr_t)i) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 1;
        }
    for (int i = 0; i < THREADS; i++) {
        void *h;
        pthread_join(t[i], &h);
        printf("thread %d: %016llx\n", i, (unsigned long long)(uintptr_t)h);
    }
    if (mallctl) {
        // Purge every arena now (madvise, and munmap with retain:false), then read the
        // statistics: some pages must have been purged.
        if (mallctl("arena.4096.purge", NULL, NULL, NULL, 0) != 0)
            fprintf(stderr, "arena.4096.purge failed\n");
        uint64_t epoch = 1, purged = 0;
        size_t len = sizeof purged;
        mallctl("epoch", NULL, NULL, &epoch, sizeof epoch);
        if (mallctl("stats.arenas.4096.dirty_purged", &purged, &len, NULL, 0) != 0)
            fprintf(stderr, "no stats.arenas.4096.dirty_purged\n");
        printf("purged: %s\n", purged > 0 ? "yes" : "no");
    }
    return failures ? 1 : 0;
}
