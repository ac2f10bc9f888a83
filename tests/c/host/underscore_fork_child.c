/* A _Fork() child, and a _Fork() grandchild, keep what the parent's cache was told or
 * found out. _Fork() is called directly (it skips the atfork handlers: the
 * child's first verbs call renews the cache). Fake provider: fork_fake.h; libibverbs'
 * passthrough: fork_shim.so (the fake has no memory window ops, so MRCACHE_REMOTE=revoke
 * passes registrations with remote access through uncached, as bypass does).
 *   underscore_fork_child remote   MRCACHE_REMOTE=revoke|bypass: a registration with remote write
 *                          access is never a hit, in the parent, the child, the grandchild
 *                          (a hit would hand out a registration whose rkey the cache kept
 *                          alive past ibv_dereg_mr); a local-only one still is.
 *   underscore_fork_child blind    MRCACHE_MONITOR=symbols (libc's internal munmap unseen: caching
 *                          fails closed at start): the child and grandchild do not cache
 *                          either; a 1 MiB malloc'd buffer freed and malloc'd again at the
 *                          same address misses.
 *   underscore_fork_child handles  a grandchild's ibv_dereg_mr of an MR in use that the
 *                          grandparent's cache handed out succeeds without reaching the
 *                          provider, as it does in the child.
 * exit 0: kept; 1: broken (printed); 3: set-up failed. */
#include "fork_fake.h"
#include <malloc.h>

extern pid_t _Fork(void);

#define MIB (1ul << 20)
#define REMOTE (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

static const char *who = "parent";

static int remote_cycle_missed(char *buf) {
    int before = registrations;
    struct ibv_mr *mr = ibv_reg_mr(&pd, buf, LEN, REMOTE);
    if (!mr) FAIL("%s: ibv_reg_mr(remote write) failed: %s", who, strerror(errno));
    dereg(mr);
    return registrations != before;
}

static void check_remote(void) {
    char *buf = map(LEN);
    remote_cycle_missed(buf);
    if (!remote_cycle_missed(buf))
        FAIL("%s: a second registration with remote write access was a hit: MRCACHE_REMOTE=%s is "
             "not applied here (the cache keeps remote keys alive past ibv_dereg_mr)",
             who, getenv("MRCACHE_REMOTE"));
    /* Not vacuous: this cache caches. */
    cycle_missed(buf, LEN);
    if (cycle_missed(buf, LEN))
        FAIL("%s: a second local-only registration missed: this cache does not cache", who);
    munmap(buf, LEN);
}

/* Whether this process's cache caches (a second registration is a hit). */
static int caches(void) {
    char *buf = map(LEN);
    cycle_missed(buf, LEN);
    int hit = !cycle_missed(buf, LEN);
    munmap(buf, LEN);
    return hit;
}

static void check_blind(void) {
    if (caches())
        FAIL("%s: a second registration was a hit: the parent failed closed (blind monitor), "
             "this process caches again with the same monitor", who);
    /* A stale hit once seen: freed through libc (its internal munmap, unseen by the
     * symbols monitor), malloc'd again at the same address. */
    for (int round = 0; round < 8; round++) {
        char *a = malloc(MIB);
        SETUP(a, "malloc");
        memset(a, 1, MIB);
        dereg(reg(a, MIB));
        uintptr_t freed = (uintptr_t)a;
        free(a);
        char *b = malloc(MIB);
        SETUP(b, "malloc");
        memset(b, 2, MIB);
        int before = registrations;
        struct ibv_mr *mr = reg(b, MIB);
        int missed = registrations != before, same = (uintptr_t)b == freed;
        dereg(mr);
        free(b);
        if (!same) continue; /* another address: try again */
        if (!missed)
            FAIL("%s: stale hit: a 1 MiB buffer freed through libc and malloc'd again at %#lx "
                 "got the freed pages' registration", who, (unsigned long)freed);
        return;
    }
    SETUP(0, "%s: malloc never gave the freed 1 MiB address back", who);
}

/* The first process's MR, in use at the forks, and the provider's deregistrations of it
 * (in this process). */
static struct ibv_mr *held;
static atomic_int held_deregs;

static int counting_dereg(struct ibv_mr *mr) {
    if (mr == held) held_deregs++;
    return fake_dereg(mr);
}

static void check_handles(void) {
    if (ibv_dereg_mr(held) != 0)
        FAIL("%s: ibv_dereg_mr of the first process's MR in use failed", who);
    if (held_deregs)
        FAIL("%s: ibv_dereg_mr of an MR the first process's cache handed out reached the "
             "provider (it deregisters that process's registration)", who);
    /* Still this process's own registrations are its own. */
    char *buf = map(LEN);
    struct ibv_mr *mine = reg(buf, LEN);
    dereg(mine);
    munmap(buf, LEN);
}

static void check(const char *mode) {
    if (!strcmp(mode, "remote")) check_remote();
    else if (!strcmp(mode, "blind")) check_blind();
    else if (!strcmp(mode, "handles")) { if (strcmp(who, "parent")) check_handles(); }
    else SETUP(0, "usage: underscore_fork_child remote|blind|handles");
}

/* _Fork(), the child running `body`; the parent waits. */
static void in_fork_child(const char *name, void (*body)(const char *), const char *mode) {
    pid_t pid = _Fork();
    SETUP(pid >= 0, "_Fork: %s", strerror(errno));
    if (pid == 0) {
        alarm(20);
        who = name;
        body(mode);
        _exit(0);
    }
    wait_child(pid, name);
}

static void grandchild(const char *mode) { check(mode); }

static void grandchild_first(const char *mode) {
    in_fork_child("grandchild (its parent made no call)", grandchild, mode);
    check(mode);
}

static void child(const char *mode) {
    if (!strcmp(mode, "handles"))
        caches(); /* a call of its own (the cache renewed); the MR deregistered after */
    else
        check(mode);
    /* After a call of its own (the cache is renewed), and before it. */
    in_fork_child("grandchild", grandchild, mode);
    if (!strcmp(mode, "handles")) check(mode);
}

int main(int argc, char **argv) {
    SETUP(argc == 2, "usage: underscore_fork_child remote|blind|handles");
    alarm(20);
    /* A fixed threshold: glibc would raise it to 1 MiB at the first free of a mapped chunk,
     * and the next 1 MiB malloc would come from the heap instead. */
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    fake_open();
    ctx.ops._compat_dereg_mr = (void *(*)(void))counting_dereg;
    if (!strcmp(argv[1], "blind") && caches())
        SETUP(0, "MRCACHE_MONITOR=%s caches here: the monitor is not blind on this libc",
              getenv("MRCACHE_MONITOR"));
    check(argv[1]);
    if (!strcmp(argv[1], "handles")) {
        held = reg(map(LEN), LEN);
    }
    /* A child whose first call comes right after _Fork(). */
    in_fork_child("child", child, argv[1]);
    /* A child that forks again before any call of its own. */
    in_fork_child("child (no call before its _Fork)", grandchild_first, argv[1]);
    puts("ok");
    return 0;
}
