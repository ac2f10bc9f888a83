/* What the guest fork programs share: a fake verbs provider (ibv_context ops, as
 * tests/c/host/fast_hit.c) that is lock-free, so threads and fork children may call it at
 * any moment; the shim's counters (fork_shim.c, preloaded after libmrcache.so); helpers.
 * Exit 0: kept; 1: broken (printed); 3: set-up failed. A hang is killed by alarm(): in the
 * parent before the fork, in the child by the program's own child handler (registered
 * before mrcache's, so it runs first). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define LEN 4096ul
#define MAGIC 0x6d72636163686521ull

struct fake_mr {
    struct ibv_mr mr;
    char room[64]; /* as a provider's own larger object */
    _Atomic uint64_t magic;
};

static atomic_int registrations, deregistrations;
static struct ibv_context ctx;
static struct ibv_pd pd;

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define SETUP(c, ...) do { if (!(c)) { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(3); } } while (0)

static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)len, (void)iova, (void)access, (void)addr;
    struct fake_mr *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->magic = MAGIC;
    m->mr.lkey = m->mr.rkey = (uint32_t)++registrations;
    return &m->mr;
}

static int fake_dereg(struct ibv_mr *mr) {
    struct fake_mr *m = (struct fake_mr *)mr;
    uint64_t want = MAGIC;
    if (!atomic_compare_exchange_strong(&m->magic, &want, 0))
        FAIL("fake provider: asked to deregister %p, not a live MR of its own", (void *)mr);
    deregistrations++;
    free(m);
    return 0;
}

static void fake_open(void) {
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    /* No kernel context behind it: no command fd. (A fork child's registrations on a context
     * whose fd is the parent's file pass to libibverbs uncached; these programs
     * test the child's own cache, which a context without a file keeps.) */
    ctx.cmd_fd = -1;
}

static inline char *map(size_t len) {
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    SETUP(p != MAP_FAILED, "mmap");
    return p;
}

static struct ibv_mr *reg(char *buf, size_t len) {
    struct ibv_mr *mr = ibv_reg_mr(&pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
    if (!mr) FAIL("ibv_reg_mr(%p, %zu) failed: %s", (void *)buf, len, strerror(errno));
    return mr;
}

static void dereg(struct ibv_mr *mr) {
    int rc = ibv_dereg_mr(mr);
    if (rc) FAIL("ibv_dereg_mr(%p) = %d", (void *)mr, rc);
}

/* reg + dereg: whether it was a new registration at the provider. */
static inline int cycle_missed(char *buf, size_t len) {
    int before = registrations;
    dereg(reg(buf, len));
    return registrations != before;
}

static inline int *shim_int(const char *name) {
    int *p = dlsym(RTLD_DEFAULT, name);
    SETUP(p, "fork_shim.so is not preloaded (%s)", name);
    return p;
}

/* The child's status as text, 0 when it exited 0. */
static inline int wait_child(pid_t pid, const char *what) {
    int st;
    SETUP(waitpid(pid, &st, 0) == pid, "waitpid");
    if (WIFSIGNALED(st))
        FAIL("%s: the child was killed by signal %d%s", what, WTERMSIG(st),
             WTERMSIG(st) == SIGALRM ? " (SIGALRM: it hung)" : "");
    if (WEXITSTATUS(st))
        FAIL("%s: the child exited %d", what, WEXITSTATUS(st));
    return 0;
}
