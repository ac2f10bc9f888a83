/* A registration made inside one of libmrcache's calls (a provider registering through the
 * public API while the cache registers, as nested_lane.c) gets the address of an MR the
 * cache has just deregistered, whose address the cache remembers (a tombstone, to catch a
 * second ibv_dereg_mr of its own handle). Its owner deregisters it later, outside any of our
 * calls: that must reach the provider, not be refused as a double deregistration.
 * The fake provider hands MR objects out of a LIFO free list, so the reuse is certain (malloc
 * reuses a just-freed block the same way). After libmrcache.so and admit_shim.so in
 * LD_PRELOAD. OUTER_REMOTE=1: the outer call has remote access (with MRCACHE_REMOTE=bypass,
 * the lane's). FORK_FIRST=1: a fork() first, which shuts the fast path's gate.
 * exit 0: the later dereg reached the provider; 1: refused or not freed; 3: set-up failed. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define POOL 64
static struct ibv_mr pool[POOL];
static struct ibv_mr *freelist[POOL];
static int nfree, live[POOL];
static struct ibv_pd pd;
static char *nest_in, *nest_on;
static struct ibv_mr *nested_mr;

static struct ibv_mr *take_mr(void) {
    struct ibv_mr *m = freelist[--nfree];
    live[m - pool] = 1;
    return m;
}

static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)iova, (void)access;
    if (nest_in && addr == nest_in) { /* the provider's own registration, first */
        nest_in = NULL;
        nested_mr = ibv_reg_mr(&pd, nest_on, 4096, IBV_ACCESS_LOCAL_WRITE);
    }
    struct ibv_mr *mr = take_mr();
    memset(mr, 0, sizeof *mr);
    mr->addr = addr, mr->length = len, mr->lkey = 7;
    return mr;
}

static int fake_dereg(struct ibv_mr *mr) {
    long i = mr - pool;
    if (i < 0 || i >= POOL || !live[i]) {
        printf("provider: dereg of %p, not a live MR\n", (void *)mr);
        return 0;
    }
    live[i] = 0;
    freelist[nfree++] = mr;
    return 0;
}

static void *nothing(void *arg) { return arg; }

int main(void) {
    /* A thread of its own first: the unmapped MR is left to mrcache's drain thread, which
     * runs only in a program that has threads (one without drains at its verbs calls). */
    pthread_t t;
    if (pthread_create(&t, NULL, nothing, NULL) || pthread_join(t, NULL)) return 3;
    for (int i = POOL - 1; i >= 0; i--) freelist[nfree++] = &pool[i];
    static struct ibv_context ctx;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    char *b = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *c = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *l = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED || c == MAP_FAILED || l == MAP_FAILED) return 3;
    memset(b, 1, 4096), memset(c, 1, 8192), memset(l, 1, 8192);
    struct ibv_mr *a = ibv_reg_mr(&pd, l, 8192, IBV_ACCESS_LOCAL_WRITE); /* cached */
    if (!a || ibv_dereg_mr(a)) return 3;
    munmap(l, 8192); /* its memory goes: the cache deregisters it, a tombstone */
    for (int i = 0; i < 100 && live[a - pool]; i++) usleep(10000); /* the drain thread */
    if (live[a - pool]) {
        printf("nested-tombstone: the unmapped MR was not deregistered\n");
        return 3;
    }
    /* FORK_FIRST=1: a fork() (the child exits at once) shuts the fast path's gate in the
     * parent until a full-path call arms it again: the outer registration below is that
     * call, and its nested registration is made while the gate is shut. */
    if (getenv("FORK_FIRST")) {
        pid_t pid = fork();
        if (pid == 0) _exit(0);
        if (pid < 0 || waitpid(pid, NULL, 0) != pid) return 3;
    }
    nest_in = c, nest_on = b;
    int remote = getenv("OUTER_REMOTE") ? IBV_ACCESS_REMOTE_WRITE : 0;
    struct ibv_mr *outer = ibv_reg_mr(&pd, c, 8192, IBV_ACCESS_LOCAL_WRITE | remote);
    if (!nested_mr) return 3;
    if (nested_mr != a) {
        printf("nested-tombstone: the nested MR did not reuse the address (%p, %p)\n", (void *)nested_mr, (void *)a);
        return 3;
    }
    int rc = ibv_dereg_mr(nested_mr); /* outside any of our calls */
    int still = live[nested_mr - pool];
    printf("nested-tombstone: ibv_dereg_mr of the nested MR at the tombstone returned %d, provider MR %s\n",
           rc, still ? "still live (leaked)" : "freed");
    if (outer) ibv_dereg_mr(outer);
    return rc || still ? 1 : 0;
}
