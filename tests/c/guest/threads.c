/* Four threads register and deregister overlapping ranges of one arena at once, each with
 * its own QP pair on the shared PD, and prove every registration with an RDMA WRITE into a
 * block of the range that only that thread writes. */
#include "lib/loopback.h"

#include <pthread.h>
#include <string.h>

#define THREADS 4
#define BLOCK (16 << 10)
#define BLOCKS 256 /* 4 MiB arena */

static struct loopback parent;
static char *arena;
static int iterations = 400;

static void *worker(void *arg) {
    int t = (int)(intptr_t)arg;
    struct loopback lb;
    CHECK(lb_open_shared(&lb, &parent) == 0, "thread %d: QP pair", t);
    unsigned seed = 1234 + t;
    for (int i = 0; i < iterations; i++) {
        int first = rand_r(&seed) % (BLOCKS - 8);
        int n = 1 + rand_r(&seed) % 8;
        int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
        if (rand_r(&seed) % 4 == 0)
            access |= IBV_ACCESS_REMOTE_READ;
        /* Ranges are not block-aligned at the start half of the time. */
        char *start = arena + (size_t)first * BLOCK + (rand_r(&seed) % 2 ? 512 : 0);
        size_t len = (size_t)n * BLOCK + BLOCK - 1024;
        struct ibv_mr *mr = ibv_reg_mr(lb.pd, start, len, access);
        CHECK(mr, "thread %d: ibv_reg_mr", t);
        CHECK(mr->addr == start && mr->length == len, "thread %d: fields", t);
        /* Our own block inside the range: blocks b with b % THREADS == t. */
        int b = first + 1;
        while (b % THREADS != t)
            b++;
        if (b < first + n) {
            char *blk = arena + (size_t)b * BLOCK;
            unsigned pat = (unsigned)(t * 100000 + i);
            lb_fill(lb.stage, BLOCK, pat);
            CHECK(lb_write(&lb, lb.stage, BLOCK, lb.stage_mr->lkey, (uintptr_t)blk, mr->rkey) == 0,
                  "thread %d: RDMA WRITE %d", t, i);
            long bad = lb_check(blk, BLOCK, pat);
            CHECK(bad < 0, "thread %d iteration %d: data did not land (offset %ld)", t, i, bad);
        }
        CHECK(ibv_dereg_mr(mr) == 0, "thread %d: ibv_dereg_mr", t);
    }
    lb_close(&lb);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1)
        iterations = atoi(argv[1]);
    CHECK(lb_open(&parent, NULL) == 0, "cannot open the loopback pair");
    arena = malloc((size_t)BLOCKS * BLOCK);
    memset(arena, 0, (size_t)BLOCKS * BLOCK);
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++)
        CHECK(pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t) == 0, "pthread_create");
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    lb_close(&parent);
    printf("threads: %d threads x %d registrations verified\n", THREADS, iterations);
    return 0;
}
