/* The pass-through's ENOMEM/EAGAIN retry (Cache::give_back_idle) behind
 * libmrcache.so and verbs_shim.c, MRCACHE_REMOTE=bypass (remote registrations pass through,
 * local ones are cached). The fake provider fails remote registrations as the mode says.
 *   passthrough_enomem always   a remote registration that always fails ENOMEM, with one idle
 *                         local entry, then with none: "always: calls A B errno X Y"
 *   passthrough_enomem eagain   remote fails EAGAIN, no idle entry: "eagain: calls A errno X"
 *   passthrough_enomem in_use   the local entry held (in use), remote over the pin limit:
 *                         "in_use: calls A errno X local_ok L"
 *   passthrough_enomem retry    pin limit one buffer, local idle: remote retried and succeeds,
 *                         its dereg reaches the provider: "retry: rc R dereg D pinned P"
 *   passthrough_enomem race     thread B hits a local entry (fast path) while thread A's remote
 *                         pass-throughs fail ENOMEM and give the idle entries back;
 *                         deregistered MRs are poisoned, never freed: "race: N hits, V dead"
 *   passthrough_enomem nested   the provider registers (nested) from inside a failing remote
 *                         registration: "nested: calls A errno X"
 *   passthrough_enomem errno    thread A's remote pass-throughs fail ENOMEM (no idle entry to give
 *                         back: the local one is held) while three threads take the cache lock
 *                         (registrations inside the held one): "errno: F failed, W not ENOMEM"
 *   passthrough_enomem fork     thread A as in race while the main thread forks 50 children that
 *                         each register: "fork: K of 50 children ok"
 * exit 0 unless set-up failed (3). */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define DEAD 0xdeadu
static atomic_int remote_calls, fail_errno, graveyard, nested_mode;
static atomic_long pinned;
static long pin_limit;
static struct ibv_context ctx;
static struct ibv_pd pd;
static char *scratch;

static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)iova;
    if (access & IBV_ACCESS_REMOTE_WRITE) {
        remote_calls++;
        if (nested_mode) {
            struct ibv_mr *n = ibv_reg_mr(&pd, scratch, 4096, IBV_ACCESS_LOCAL_WRITE);
            if (n) ibv_dereg_mr(n);
        }
        if (fail_errno) {
            errno = fail_errno;
            return NULL;
        }
    }
    if (pin_limit && pinned + (long)len > pin_limit) {
        errno = ENOMEM;
        return NULL;
    }
    pinned += len;
    struct ibv_mr *mr = calloc(1, sizeof(struct ibv_mr) + 64);
    mr->addr = addr, mr->length = len, mr->lkey = 7, mr->rkey = 7;
    return mr;
}
static int fake_dereg(struct ibv_mr *mr) {
    if (mr->lkey == DEAD) {
        fprintf(stderr, "provider: dereg of a deregistered MR %p\n", (void *)mr);
        abort();
    }
    pinned -= mr->length;
    mr->lkey = DEAD;
    if (!graveyard) free(mr);
    return 0;
}

static char *map(size_t len) {
    char *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(b, 1, len);
    return b;
}

static const int RW = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
static size_t len = 64 << 10;
static char *lbuf, *rbuf;
static atomic_int stop;

static void *remote_loop(void *arg) {
    (void)arg;
    while (!stop) {
        struct ibv_mr *mr = ibv_reg_mr(&pd, rbuf, len, RW);
        if (mr) ibv_dereg_mr(mr);
    }
    return NULL;
}

static void *lock_loop(void *arg) {
    (void)arg;
    while (!stop) {
        struct ibv_mr *m = ibv_reg_mr(&pd, lbuf + 4096, 8192, IBV_ACCESS_LOCAL_WRITE);
        if (m) ibv_dereg_mr(m);
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "always";
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    lbuf = map(len), rbuf = map(len), scratch = map(4096);
    if (!strcmp(mode, "always") || !strcmp(mode, "nested")) {
        nested_mode = !strcmp(mode, "nested");
        struct ibv_mr *l = ibv_reg_mr(&pd, lbuf, len, IBV_ACCESS_LOCAL_WRITE);
        if (!l || ibv_dereg_mr(l)) return 3; /* idle now */
        fail_errno = ENOMEM;
        errno = 0;
        struct ibv_mr *r = ibv_reg_mr(&pd, rbuf, len, RW);
        int e1 = errno, c1 = remote_calls;
        errno = 0;
        struct ibv_mr *r2 = ibv_reg_mr(&pd, rbuf, len, RW);
        int e2 = errno, c2 = remote_calls - c1;
        printf("%s: calls %d %d errno %d %d null %d %d\n", mode, c1, c2, e1, e2, !r, !r2);
        return 0;
    }
    if (!strcmp(mode, "eagain")) {
        fail_errno = EAGAIN;
        errno = 0;
        struct ibv_mr *r = ibv_reg_mr(&pd, rbuf, len, RW);
        printf("eagain: calls %d errno %d null %d\n", remote_calls, errno, !r);
        return 0;
    }
    if (!strcmp(mode, "in_use")) {
        pin_limit = len;
        struct ibv_mr *l = ibv_reg_mr(&pd, lbuf, len, IBV_ACCESS_LOCAL_WRITE);
        if (!l) return 3;
        errno = 0;
        struct ibv_mr *r = ibv_reg_mr(&pd, rbuf, len, RW);
        int e = errno;
        printf("in_use: calls %d errno %d null %d local_ok %d\n", remote_calls, e, !r, l->lkey == 7);
        return ibv_dereg_mr(l) ? 3 : 0;
    }
    if (!strcmp(mode, "retry")) {
        pin_limit = len;
        struct ibv_mr *l = ibv_reg_mr(&pd, lbuf, len, IBV_ACCESS_LOCAL_WRITE);
        if (!l || ibv_dereg_mr(l)) return 3;
        struct ibv_mr *r = ibv_reg_mr(&pd, rbuf, len, RW);
        if (!r) {
            printf("retry: rc -1 errno %d calls %d\n", errno, remote_calls);
            return 0;
        }
        int same = r == l;
        int d = ibv_dereg_mr(r);
        long p = pinned;
        struct ibv_mr *l2 = ibv_reg_mr(&pd, lbuf, len, IBV_ACCESS_LOCAL_WRITE);
        printf("retry: rc 0 dereg %d pinned %ld calls %d reused_address %d local_again %d\n", d, p, remote_calls,
               same, l2 != NULL);
        return 0;
    }
    if (!strcmp(mode, "errno")) {
        fail_errno = ENOMEM;
        struct ibv_mr *l = ibv_reg_mr(&pd, lbuf, len, IBV_ACCESS_LOCAL_WRITE);
        if (!l) return 3;
        pthread_t b[3];
        for (int i = 0; i < 3; i++) pthread_create(&b[i], NULL, lock_loop, NULL);
        long failed = 0, wrong = 0, other = 0;
        for (long i = 0; i < 6000000 && !(wrong && i > 100000); i++) {
            errno = 0;
            struct ibv_mr *r = ibv_reg_mr(&pd, rbuf, len, RW);
            if (r) return 3;
            failed++;
            if (errno != ENOMEM) {
                wrong++;
                other = errno;
            }
        }
        stop = 1;
        for (int i = 0; i < 3; i++) pthread_join(b[i], NULL);
        printf("errno: %ld failed, %ld not ENOMEM (last %ld), calls %d\n", failed, wrong, other, remote_calls);
        return ibv_dereg_mr(l) ? 3 : 0;
    }
    if (!strcmp(mode, "race") || !strcmp(mode, "fork")) {
        graveyard = !strcmp(mode, "race");
        fail_errno = ENOMEM;
        struct ibv_mr *l = ibv_reg_mr(&pd, lbuf, len, IBV_ACCESS_LOCAL_WRITE);
        if (!l || ibv_dereg_mr(l)) return 3;
        pthread_t a;
        pthread_create(&a, NULL, remote_loop, NULL);
        long hits = 0, dead = 0, ok = 0;
        if (graveyard) {
            for (long i = 0; i < 200000; i++) {
                struct ibv_mr *m = ibv_reg_mr(&pd, lbuf, len, IBV_ACCESS_LOCAL_WRITE);
                if (!m) return 3;
                if (m->lkey == DEAD) dead++;
                for (volatile int k = 0; k < 50; k++) {
                }
                if (m->lkey == DEAD) dead++;
                if (ibv_dereg_mr(m)) return 3;
                hits++;
            }
        } else {
            for (int i = 0; i < 50; i++) {
                pid_t c = fork();
                if (c == 0) {
                    struct ibv_mr *m = ibv_reg_mr(&pd, lbuf, len, IBV_ACCESS_LOCAL_WRITE);
                    _exit(m && !ibv_dereg_mr(m) ? 0 : 1);
                }
                int st;
                if (waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0) ok++;
                struct ibv_mr *m = ibv_reg_mr(&pd, lbuf, len, IBV_ACCESS_LOCAL_WRITE);
                if (!m || ibv_dereg_mr(m)) return 3;
            }
        }
        stop = 1;
        pthread_join(a, NULL);
        if (graveyard)
            printf("race: %ld hits, %ld dead, remote calls %d\n", hits, dead, remote_calls);
        else
            printf("fork: %ld of 50 children ok\n", ok);
        return 0;
    }
    return 2;
}
