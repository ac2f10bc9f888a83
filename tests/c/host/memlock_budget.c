/* The locked-memory limit: a fake provider charges each registration the pages it spans
 * against a budget and fails with ENOMEM beyond it, as ib_umem_get does against
 * RLIMIT_MEMLOCK without CAP_IPC_LOCK. The program drops CAP_IPC_LOCK and sets
 * RLIMIT_MEMLOCK to the budget, so that the pins are charged for the preload too.
 *   memlock_budget scenario      a 2 MiB buffer A registered and deregistered four times,
 *                                4 KiB inside A registered and kept, then a 2 MiB buffer B,
 *                                budget 3 MiB: "scenario: small 1 big 1 errno 0 pinned P"
 *   memlock_budget uncharged     the same with CAP_IPC_LOCK kept and no budget: whether the
 *                                4 KiB registration shares A's registration (its lkey):
 *                                "uncharged: shares 1"
 *   memlock_budget drain         budget 3 MiB: a 2 MiB buffer A registered, deregistered (idle)
 *                                and unmapped; the provider's deregistration is slow (200 ms)
 *                                and, under the preload, made by the background drain (a
 *                                thread started first, so that it runs); while
 *                                it is in flight a 2 MiB buffer B is registered:
 *                                "drain: big 1 errno 0"
 *   memlock_budget random SEED [REF]
 *                                a seeded sequence of registrations (new ranges, the same
 *                                range again, ranges inside earlier ones, local and remote
 *                                rights) and deregistrations of live handles under a seeded
 *                                budget. Without REF it prints one "op" line per step (the
 *                                reference run, the fake provider alone). With REF (that
 *                                output) it follows the reference: a registration that
 *                                succeeds here but failed there is deregistered at once, so
 *                                both runs hold the same live handles; it ends with
 *                                "random: seed S ops N ref_ok R worse W better B" (worse: the
 *                                reference succeeded, this run failed).
 * exit 0 unless set-up failed (3). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <infiniband/verbs.h>
#include <linux/capability.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

static long page, budget, next_key = 1;
static _Atomic long pinned;
static struct ibv_context ctx;
static struct ibv_pd pd;

static long charge(const void *addr, size_t len) {
    uintptr_t a = (uintptr_t)addr, first = a / page, last = (a + len + page - 1) / page;
    return (long)(last - first) * page;
}

static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)iova, (void)access;
    long c = charge(addr, len);
    if (budget && pinned + c > budget) {
        errno = ENOMEM;
        return NULL;
    }
    pinned += c;
    struct ibv_mr *mr = calloc(1, sizeof(struct ibv_mr) + 64);
    mr->lkey = mr->rkey = (uint32_t)next_key++;
    return mr;
}

static _Atomic int slow_dereg, in_dereg;

static int fake_dereg(struct ibv_mr *mr) {
    if (slow_dereg) {
        in_dereg = 1;
        usleep(200000);
    }
    pinned -= charge(mr->addr, mr->length);
    free(mr);
    return 0;
}

/* No CAP_IPC_LOCK in any set, RLIMIT_MEMLOCK = `limit` bytes: the kernel would charge. */
static int charged(long limit) {
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d)) return -1;
    for (int i = 0; i < 2; i++) d[i].effective &= ~(1u << CAP_IPC_LOCK), d[i].permitted &= ~(1u << CAP_IPC_LOCK);
    if (syscall(SYS_capset, &h, d)) return -1;
    struct rlimit r = {(rlim_t)limit, (rlim_t)limit};
    return setrlimit(RLIMIT_MEMLOCK, &r);
}

static char *map(size_t len) {
    char *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) exit(3);
    memset(b, 1, len);
    return b;
}

static int scenario(int keep_cap) {
    const size_t two = 2 << 20;
    if (!keep_cap) {
        budget = 3 << 20;
        if (charged(budget)) return 3;
    }
    char *a = map(two), *b = map(two);
    uint32_t a_key = 0;
    for (int i = 0; i < 4; i++) {
        struct ibv_mr *m = ibv_reg_mr(&pd, a, two, IBV_ACCESS_LOCAL_WRITE);
        if (!m) return 3;
        a_key = m->lkey;
        if (ibv_dereg_mr(m)) return 3;
    }
    struct ibv_mr *small = ibv_reg_mr(&pd, a + 4096, 4096, IBV_ACCESS_LOCAL_WRITE);
    if (keep_cap) {
        printf("uncharged: shares %d\n", small && small->lkey == a_key);
        return 0;
    }
    errno = 0;
    struct ibv_mr *big = ibv_reg_mr(&pd, b, two, IBV_ACCESS_LOCAL_WRITE);
    int e = big ? 0 : errno;
    printf("scenario: small %d big %d errno %d pinned %ld\n", small != NULL, big != NULL, e, pinned);
    if (big) ibv_dereg_mr(big);
    if (small) ibv_dereg_mr(small);
    return 0;
}

static void *nothing(void *arg) { return arg; }

static int drain(void) {
    const size_t two = 2 << 20;
    /* The background drain runs on a thread of the library's, which it starts only in a
     * program that has had a thread of its own (a program without threads drains inside its
     * next registration): one first. */
    pthread_t t;
    if (pthread_create(&t, NULL, nothing, NULL) || pthread_join(t, NULL)) return 3;
    budget = 3 << 20;
    if (charged(budget)) return 3;
    char *a = map(two), *b = map(two);
    struct ibv_mr *m = ibv_reg_mr(&pd, a, two, IBV_ACCESS_LOCAL_WRITE);
    if (!m) return 3;
    slow_dereg = 1;
    if (ibv_dereg_mr(m)) return 3;
    munmap(a, two);
    for (int i = 0; i < 2000 && !in_dereg; i++) usleep(1000);
    if (!in_dereg) {
        printf("drain: the deregistration never started\n");
        return 0;
    }
    errno = 0;
    struct ibv_mr *big = ibv_reg_mr(&pd, b, two, IBV_ACCESS_LOCAL_WRITE);
    printf("drain: big %d errno %d\n", big != NULL, big ? 0 : errno);
    return 0;
}

static uint64_t rng;
static uint64_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
static uint64_t below(uint64_t n) { return next() % n; }

#define LIVE 12
#define PAST 16
#define OPS 400
#define ARENA (12 << 20)

static int random_run(unsigned long seed, const char *ref_path) {
    rng = seed * 0x9e3779b97f4a7c15ull + 1;
    static const long budgets[] = {1 << 20, 2 << 20, 3 << 20, 4 << 20, 6 << 20};
    budget = budgets[below(5)];
    if (charged(budget)) return 3;
    FILE *ref = ref_path ? fopen(ref_path, "r") : NULL;
    if (ref_path && !ref) return 3;
    char *arena = map(ARENA);
    struct {
        struct ibv_mr *mr;
        int held; /* the reference holds a handle here */
    } live[LIVE] = {{0}};
    struct {
        size_t off, len;
    } past[PAST] = {{0}};
    int npast = 0, ref_ok = 0, worse = 0, better = 0;
    for (int op = 0; op < OPS; op++) {
        int slot = (int)below(LIVE);
        if (live[slot].held) {
            int rc = live[slot].mr ? ibv_dereg_mr(live[slot].mr) : 0;
            live[slot].mr = NULL, live[slot].held = 0;
            if (!ref) printf("op %d dereg %d\n", op, rc);
            continue;
        }
        size_t off, len;
        uint64_t kind = below(10);
        if (npast && kind < 3) { /* the same range again */
            int p = (int)below((uint64_t)npast);
            off = past[p].off, len = past[p].len;
        } else if (npast && kind < 6) { /* a range inside an earlier one */
            int p = (int)below((uint64_t)npast);
            size_t l = 1 + below(past[p].len);
            off = past[p].off + below(past[p].len - l + 1), len = l;
        } else {
            static const size_t scale[] = {4096, 64 << 10, 1 << 20, 3 << 20};
            len = 1 + below(scale[below(4)]);
            off = below(ARENA - len);
            if (below(2)) off &= ~(size_t)4095;
            int p = npast < PAST ? npast++ : (int)below(PAST);
            past[p].off = off, past[p].len = len;
        }
        int access = IBV_ACCESS_LOCAL_WRITE;
        if (below(4) == 0) access |= IBV_ACCESS_REMOTE_READ;
        if (below(8) == 0) access = 0;
        errno = 0;
        struct ibv_mr *mr = ibv_reg_mr(&pd, arena + off, len, access);
        int e = mr ? 0 : errno;
        if (!ref) {
            printf("op %d reg %zu %zu %d %s %d\n", op, off, len, access, mr ? "ok" : "fail", e);
            live[slot].mr = mr, live[slot].held = mr != NULL;
            continue;
        }
        char line[256], want[8] = "";
        int rop = -1;
        do { /* the reference's line for this op */
            if (!fgets(line, sizeof line, ref)) return 3;
        } while (sscanf(line, "op %d reg %*u %*u %*d %7s", &rop, want) != 2 || rop != op);
        int rok = !strcmp(want, "ok");
        ref_ok += rok;
        if (rok && !mr) {
            worse++;
            printf("worse: op %d reg %zu %zu access %d errno %d pinned %ld budget %ld\n", op, off, len, access, e,
                   pinned, budget);
        }
        if (!rok && mr) {
            better++;
            if (ibv_dereg_mr(mr)) return 3;
            mr = NULL;
        }
        live[slot].mr = mr, live[slot].held = rok;
    }
    for (int i = 0; i < LIVE; i++)
        if (live[i].mr && ibv_dereg_mr(live[i].mr)) return 3;
    if (ref) printf("random: seed %lu ops %d ref_ok %d worse %d better %d\n", seed, OPS, ref_ok, worse, better);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "scenario";
    page = sysconf(_SC_PAGESIZE);
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(mode, "scenario")) return scenario(0);
    if (!strcmp(mode, "uncharged")) return scenario(1);
    if (!strcmp(mode, "drain")) return drain();
    if (!strcmp(mode, "random") && argc > 2) return random_run(strtoul(argv[2], NULL, 10), argc > 3 ? argv[3] : NULL);
    return 2;
}
