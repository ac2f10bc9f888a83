/* An ordinary program, built with a sanitizer (ASan, TSan, UBSan): it must start and run
 * the same with libmrcache.so preloaded as without (tests/host/sanitizer_builds.rs). Threads
 * that malloc/free small and large (mmapped) blocks and realloc them, explicit mmap,
 * mremap (a MAP_FIXED mmap under TSan), madvise and munmap, then a deterministic summary
 * on stdout and exit status 7.
 * No verbs call: the library stays idle. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define THREADS 4
#define ROUNDS 200

static uint64_t sums[THREADS];

static void *work(void *arg) {
    int t = (int)(intptr_t)arg;
    uint64_t sum = 0;
    for (int r = 0; r < ROUNDS; r++) {
        size_t small = 16 + (size_t)(r % 64) * 8, large = (size_t)(256 + r % 4) << 10;
        unsigned char *a = malloc(small), *b = malloc(large);
        if (!a || !b) return (void *)1;
        memset(a, t + r, small);
        memset(b, r, large);
        unsigned char *c = realloc(a, small * 3);
        if (!c) return (void *)1;
        sum += c[small - 1] + b[large - 1];
        free(c);
        free(b);
        char *m = mmap(NULL, 3 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return (void *)1;
        m[0] = (char)r;
#ifndef __SANITIZE_THREAD__
        size_t total = 5 << 16;
        m = mremap(m, 3 << 16, total, MREMAP_MAYMOVE);
#else
        /* TSan does not intercept mremap: a moved mapping keeps the shadow of what another
         * thread had there, and reading it is reported as a race. A fixed mapping instead. */
        size_t total = 3 << 16;
        m = mmap(m, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (m != MAP_FAILED) m[0] = (char)r;
#endif
        if (m == MAP_FAILED) return (void *)1;
        sum += (unsigned char)m[0];
        if (madvise(m, 1 << 16, MADV_DONTNEED) || munmap(m, total)) return (void *)1;
    }
    sums[t] = sum;
    return NULL;
}

int main(void) {
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++)
        if (pthread_create(&th[t], NULL, work, (void *)(intptr_t)t)) return 3;
    for (int t = 0; t < THREADS; t++) {
        void *rc;
        if (pthread_join(th[t], &rc) || rc) return 3;
    }
    for (int t = 0; t < THREADS; t++) printf("thread %d: %llu\n", t, (unsigned long long)sums[t]);
    printf("done\n");
    return 7;
}
