/* Stress (a bench-style run, not a timed test): 4 threads for N seconds register, release,
 * free, unmap and zap random buffers, each thread with its own QP pair on one PD, and prove
 * every registration with an RDMA WRITE. Prints progress (RSS, counts) every 10 s and a
 * summary; exits 1 if any registration was stale.
 *   stress [SECONDS] */
#include "lib/loopback.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define THREADS 4
#define SLOTS 12

static struct loopback parent;
static double deadline;
static atomic_long regs, stale, frees, unmaps, zaps;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static long rss_kib(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, field, strlen(field)))
            v = atol(line + strlen(field) + 1);
    if (f)
        fclose(f);
    return v;
}

struct slot {
    char *p;
    size_t len;
    int mapped; /* 1: mmap, 0: malloc */
};

static void *worker(void *arg) {
    unsigned seed = 99 + (unsigned)(intptr_t)arg;
    struct loopback lb;
    CHECK(lb_open_shared(&lb, &parent) == 0, "QP pair");
    struct slot s[SLOTS] = {0};
    while (now() < deadline) {
        struct slot *x = &s[rand_r(&seed) % SLOTS];
        int op = rand_r(&seed) % 10;
        if (!x->p) {
            x->len = (size_t)(1 + rand_r(&seed) % 64) * 16384;
            x->mapped = rand_r(&seed) % 2;
            x->p = x->mapped ? mmap(NULL, x->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                             : malloc(x->len);
            CHECK(x->p && x->p != MAP_FAILED, "allocation");
            memset(x->p, 1, x->len);
        } else if (op < 6) {
            size_t off = (size_t)(rand_r(&seed) % 4) * 4096 % x->len;
            size_t len = x->len - off;
            if (len > LB_STAGE_BYTES)
                len = LB_STAGE_BYTES;
            struct ibv_mr *mr = ibv_reg_mr(lb.pd, x->p + off, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
            CHECK(mr, "ibv_reg_mr");
            if (lb_prove_write(&lb, mr, x->p + off, len, (unsigned)rand_r(&seed)))
                atomic_fetch_add(&stale, 1);
            CHECK(ibv_dereg_mr(mr) == 0, "dereg");
            atomic_fetch_add(&regs, 1);
        } else if (op < 8) {
            if (x->mapped) {
                munmap(x->p, x->len);
                atomic_fetch_add(&unmaps, 1);
            } else {
                free(x->p);
                atomic_fetch_add(&frees, 1);
            }
            x->p = NULL;
        } else if (x->mapped) {
            madvise(x->p, x->len, MADV_DONTNEED);
            atomic_fetch_add(&zaps, 1);
        }
    }
    for (int i = 0; i < SLOTS; i++)
        if (s[i].p) {
            if (s[i].mapped)
                munmap(s[i].p, s[i].len);
            else
                free(s[i].p);
        }
    lb_close(&lb);
    return NULL;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 60;
    CHECK(lb_open(&parent, NULL) == 0, "cannot open the loopback pair");
    double t0 = now();
    deadline = t0 + secs;
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++)
        pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
    while (now() < deadline) {
        sleep(10 < secs ? 10 : 1);
        printf("STRESS t=%.0fs registrations=%ld stale=%ld frees=%ld unmaps=%ld zaps=%ld rss_kib=%ld\n", now() - t0,
               atomic_load(&regs), atomic_load(&stale), atomic_load(&frees), atomic_load(&unmaps),
               atomic_load(&zaps), rss_kib("VmRSS:"));
        fflush(stdout);
    }
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    lb_close(&parent);
    printf("STRESS done: %.0f s, %ld registrations proven, %ld stale, %ld frees, %ld munmaps, %ld madvise; peak RSS %ld KiB\n",
           now() - t0, atomic_load(&regs), atomic_load(&stale), atomic_load(&frees), atomic_load(&unmaps),
           atomic_load(&zaps), rss_kib("VmHWM:"));
    return atomic_load(&stale) ? 1 : 0;
}
