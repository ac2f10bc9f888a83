/* fork() with cached registrations.
 *
 *   fork basic            parent with an idle and an in-use cached MR forks; the child
 *                         writes its own copies and exits; the parent writes its buffers
 *                         and proves an RDMA WRITE reaches each. FORK_EXPECT_IDLE=hit|miss
 *                         says whether the idle one must still be cached (preload only).
 *   fork underscore       the same through _Fork(), which skips atfork handlers.
 *   fork child_registers  the child opens the device and registers its own memory.
 *   fork tracking         with RDMAV_FORK_SAFE=1, as libibverbs alone does it (probed on a
 *                         scratch page): where it marks DONTFORK, the in-use range is not
 *                         inherited by the child (DONTFORK during the fork); where it marks
 *                         nothing (IBV_FORK_UNNEEDED, rdma-core >= 51), the child inherits it
 *                         with the parent's bytes and nothing is marked; libibverbs' DONTFORK
 *                         reference counts are balanced afterwards (VmFlags "dc").
 *   fork dead_in_use      with RDMAV_FORK_SAFE=1: a registration in use whose memory was
 *                         unmapped and replaced by new memory at the same address; the
 *                         child must inherit the new memory (no DONTFORK on a dead range).
 *   fork thread           a second thread forks while the first registers.
 *   fork loop             200 forks with registrations between them; nothing leaks.
 */
#include "lib/loopback.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
#define LEN (1u << 20)

static struct loopback lb;

static char *map(void) {
    char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED, "mmap");
    memset(p, 1, LEN);
    return p;
}

static int wait_child(pid_t pid) {
    int st;
    CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Whether the VMA holding addr has VmFlags "dc" (VM_DONTCOPY, set by MADV_DONTFORK); -1 if
 * unmapped. */
static int dontfork(void *addr) {
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    int in = 0, r = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' '))
            in = (uintptr_t)addr >= a && (uintptr_t)addr < b;
        else if (in && !strncmp(line, "VmFlags:", 8)) {
            r = strstr(line, " dc") != NULL;
            break;
        }
    }
    fclose(f);
    return r;
}

static int basic(int use_underscore) {
    char *a = map(), *b = map();
    struct ibv_mr *ma = ibv_reg_mr(lb.pd, a, LEN, ACCESS);
    CHECK(ma, "reg a");
    uint32_t a_lkey = ma->lkey;
    CHECK(ibv_dereg_mr(ma) == 0, "dereg a"); /* idle in the cache */
    struct ibv_mr *mb = ibv_reg_mr(lb.pd, b, LEN, ACCESS); /* in use across the fork */
    CHECK(mb, "reg b");
    pid_t pid = use_underscore ? _Fork() : fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        memset(a, 0x33, LEN);
        memset(b, 0x33, LEN);
        _exit(0);
    }
    CHECK(wait_child(pid) == 0, "child failed");
    memset(a, 0x44, LEN); /* the parent writes: a copy-on-write break would move it */
    memset(b, 0x44, LEN);
    ma = ibv_reg_mr(lb.pd, a, LEN, ACCESS);
    CHECK(ma, "re-register a");
    const char *expect = getenv("FORK_EXPECT_IDLE");
    if (mrcache_loaded() && expect) {
        int hit = ma->lkey == a_lkey;
        CHECK(hit == !strcmp(expect, "hit"), "the idle entry was %s after fork, expected %s", hit ? "kept" : "flushed", expect);
    }
    CHECK(lb_prove_write(&lb, ma, a, LEN, 1) == 0, "data did not reach the idle buffer after fork");
    CHECK(lb_prove_write(&lb, mb, b, LEN, 2) == 0, "data did not reach the in-use buffer after fork");
    CHECK(ibv_dereg_mr(ma) == 0 && ibv_dereg_mr(mb) == 0, "dereg");
    return 0;
}

static int child_registers(void) {
    char *a = map();
    struct ibv_mr *ma = ibv_reg_mr(lb.pd, a, LEN, ACCESS);
    CHECK(ma && ibv_dereg_mr(ma) == 0, "warm");
    pid_t pid = fork();
    if (pid == 0) {
        struct loopback own;
        CHECK(lb_open(&own, NULL) == 0, "child: open the device");
        char *c = map();
        for (int i = 0; i < 20; i++) {
            struct ibv_mr *m = ibv_reg_mr(own.pd, c, LEN, ACCESS);
            CHECK(m, "child: reg");
            CHECK(lb_prove_write(&own, m, c, LEN, 10 + i) == 0, "child: data");
            CHECK(ibv_dereg_mr(m) == 0, "child: dereg");
        }
        /* The parent's buffer, registered in the child on the child's PD, works too. */
        struct ibv_mr *m = ibv_reg_mr(own.pd, a, LEN, ACCESS);
        CHECK(m && m->pd == own.pd, "child: reg of the parent's buffer on the child's PD");
        CHECK(lb_prove_write(&own, m, a, LEN, 5) == 0, "child: data into the inherited buffer");
        CHECK(ibv_dereg_mr(m) == 0, "child: dereg");
        lb_close(&own);
        _exit(0);
    }
    CHECK(pid > 0 && wait_child(pid) == 0, "the child failed");
    ma = ibv_reg_mr(lb.pd, a, LEN, ACCESS);
    CHECK(ma && lb_prove_write(&lb, ma, a, LEN, 3) == 0, "parent after the child");
    CHECK(ibv_dereg_mr(ma) == 0, "dereg");
    return 0;
}

/* Exported by libibverbs (IBVERBS_1.1), declared only in its internal headers. */
int ibv_dontfork_range(void *base, size_t size);
int ibv_dofork_range(void *base, size_t size);

/* What libibverbs itself does under RDMAV_FORK_SAFE=1: whether its ibv_dontfork_range marks
 * a scratch page DONTFORK (1) or not (0). rdma-core < 51 always marks. rdma-core >= 51
 * (commit 5a11b68ca, "ignore IBV_FORK_SAFE et.al. when kernel has fork support"; Debian 13
 * has 56.1) leaves ibv_fork_init undone, so ibv_dontfork_range is a no-op, when the kernel
 * copies pinned pages at fork (ibv_is_fork_initialized() == IBV_FORK_UNNEEDED). Called
 * directly, it is libibverbs' own (the cache does not hook it). */
static int libibverbs_marks(void) {
    char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED, "mmap");
    CHECK(ibv_dontfork_range(p, 4096) == 0, "ibv_dontfork_range on a scratch page");
    int marks = dontfork(p);
    CHECK(ibv_dofork_range(p, 4096) == 0 && dontfork(p) == 0, "ibv_dofork_range on a scratch page");
    CHECK(munmap(p, 4096) == 0, "munmap");
    return marks;
}

/* Under RDMAV_FORK_SAFE=1 the cache does what libibverbs alone does: where libibverbs marks
 * registered ranges DONTFORK, a range in use is not inherited by the child (the cache marks it
 * for the fork's duration, libibverbs for the registration's); where libibverbs marks nothing
 * (IBV_FORK_UNNEEDED on rdma-core >= 51), the child inherits the range with the parent's
 * bytes (the kernel copies pinned pages) and nothing is marked. */
static int tracking(void) {
    const char *safe = getenv("RDMAV_FORK_SAFE");
    CHECK(safe && strcmp(safe, "0"), "run with RDMAV_FORK_SAFE=1");
    int marks = libibverbs_marks();
    enum ibv_fork_status status = ibv_is_fork_initialized();
    printf("fork tracking: libibverbs %s registered ranges DONTFORK; ibv_is_fork_initialized() = %d\n",
           marks ? "marks" : "does not mark", (int)status);
    CHECK(marks || status == IBV_FORK_UNNEEDED,
          "RDMAV_FORK_SAFE=1 and libibverbs marks nothing, yet ibv_is_fork_initialized() = %d, not IBV_FORK_UNNEEDED",
          (int)status);
    char *b = map();
    struct ibv_mr *mb = ibv_reg_mr(lb.pd, b, LEN, ACCESS);
    CHECK(mb, "reg b");
    memset(b, 0x5a, LEN);
    /* libibverbs alone marks a registered range DONTFORK (where it marks at all); the cache
     * registers through the provider and marks it only for the duration of a fork. */
    int dd = dontfork(b);
    CHECK(dd == (marks && !mrcache_loaded() ? 1 : 0), "VmFlags dc while registered: %d (libibverbs marks: %d)", dd, marks);
    pid_t pid = fork();
    if (pid == 0) {
        if (marks)
            _exit(dontfork(b) == -1 ? 0 : 1); /* DONTFORK: not inherited */
        if (dontfork(b) != 0)
            _exit(2); /* not inherited, or inherited marked */
        _exit(b[0] == 0x5a && b[LEN / 2] == 0x5a && b[LEN - 1] == 0x5a ? 0 : 3);
    }
    CHECK(pid > 0, "fork");
    int st = wait_child(pid);
    if (marks)
        CHECK(st == 0, "the child inherited the registered range: no DONTFORK at fork");
    else
        CHECK(st == 0, "libibverbs marks nothing here, yet the child did not inherit the registered range with the parent's bytes (status %d: 2 = not inherited or marked DONTFORK, 3 = other bytes)", st);
    CHECK(dontfork(b) == dd, "the parent's DONTFORK state changed across the fork");
    CHECK(lb_prove_write(&lb, mb, b, LEN, 6) == 0, "data after fork");
    CHECK(ibv_dereg_mr(mb) == 0, "dereg");
    /* libibverbs' reference counts are balanced: marking the range through libibverbs itself
     * (what its own ibv_reg_mr does; a dlvsym'd ibv_reg_mr would reach mrcache's hook) sets
     * DONTFORK where it marks at all (a no-op where not), and unmarking it clears it again. */
    CHECK(ibv_dontfork_range(b, LEN) == 0 && dontfork(b) == marks,
          "libibverbs' own marking must %s DONTFORK, as on the scratch page", marks ? "set" : "leave unset");
    CHECK(ibv_dofork_range(b, LEN) == 0, "ibv_dofork_range");
    CHECK(dontfork(b) == 0, "DONTFORK left behind: libibverbs' reference counts are unbalanced");
    return 0;
}

static int dead_in_use(void) {
    char *b = map();
    struct ibv_mr *mb = ibv_reg_mr(lb.pd, b, LEN, ACCESS); /* stays in use */
    CHECK(mb, "reg b");
    CHECK(munmap(b, LEN) == 0, "munmap");
    char *n = mmap(b, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(n == b, "new memory at the old address");
    memset(n, 0x55, LEN);
    pid_t pid = fork();
    if (pid == 0)
        _exit(n[0] == 0x55 && n[LEN - 1] == 0x55 ? 0 : 1); /* SIGSEGV if not inherited */
    CHECK(pid > 0, "fork");
    int st = wait_child(pid);
    CHECK(st == 0, "the child did not inherit the new memory at the registered address (status %d): the dead registration's range was marked DONTFORK", st);
    CHECK(dontfork(n) == 0, "the new memory is left marked DONTFORK in the parent");
    CHECK(ibv_dereg_mr(mb) == 0, "dereg");
    return 0;
}

static volatile int stop;

static void *forker(void *arg) {
    int *forks = arg;
    while (!stop) {
        pid_t pid = fork();
        if (pid == 0)
            _exit(0);
        CHECK(pid > 0 && wait_child(pid) == 0, "fork from the second thread");
        (*forks)++;
    }
    return NULL;
}

static int thread_fork(void) {
    char *a = map();
    int forks = 0;
    pthread_t t;
    pthread_create(&t, NULL, forker, &forks);
    for (int i = 0; i < 300; i++) {
        struct ibv_mr *m = ibv_reg_mr(lb.pd, a + (i % 4) * 4096, LEN / 2, ACCESS);
        CHECK(m, "reg %d", i);
        if (i % 10 == 0)
            CHECK(lb_prove_write(&lb, m, a + (i % 4) * 4096, LEN / 2, i) == 0, "data %d", i);
        CHECK(ibv_dereg_mr(m) == 0, "dereg");
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("fork thread: %d forks while registering\n", forks);
    CHECK(forks > 0, "no fork happened");
    return 0;
}

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            v = atol(line + 6);
    fclose(f);
    return v;
}

static int loop(void) {
    char *bufs[4];
    for (int i = 0; i < 4; i++)
        bufs[i] = map();
    long rss0 = 0;
    for (int i = 0; i < 200; i++) {
        char *p = bufs[i % 4];
        struct ibv_mr *m = ibv_reg_mr(lb.pd, p, LEN, ACCESS);
        CHECK(m, "reg %d", i);
        if (i % 20 == 0)
            CHECK(lb_prove_write(&lb, m, p, LEN, i) == 0, "data %d", i);
        CHECK(ibv_dereg_mr(m) == 0, "dereg");
        pid_t pid = fork();
        if (pid == 0)
            _exit(0);
        CHECK(pid > 0 && wait_child(pid) == 0, "fork %d", i);
        if (i == 20)
            rss0 = rss_kib();
    }
    long grew = rss_kib() - rss0;
    printf("fork loop: 200 forks, RSS grew %ld KiB over the last 180\n", grew);
    CHECK(grew < 4096, "memory grows with forks: %ld KiB", grew);
    return 0; /* lb_close checks the PD can be freed: no MR leaked */
}

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: fork basic|underscore|child_registers|tracking|dead_in_use|thread|loop");
    CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
    int rc;
    if (!strcmp(argv[1], "basic"))
        rc = basic(0);
    else if (!strcmp(argv[1], "underscore"))
        rc = basic(1);
    else if (!strcmp(argv[1], "child_registers"))
        rc = child_registers();
    else if (!strcmp(argv[1], "tracking"))
        rc = tracking();
    else if (!strcmp(argv[1], "dead_in_use"))
        rc = dead_in_use();
    else if (!strcmp(argv[1], "thread"))
        rc = thread_fork();
    else if (!strcmp(argv[1], "loop"))
        rc = loop();
    else
        CHECK(0, "unknown scenario %s", argv[1]);
    lb_close(&lb);
    printf("fork %s: ok\n", argv[1]);
    return rc;
}
