/* Differential conformance: drives sequences of verbs calls and prints, for each
 * call, its result, errno (set to a sentinel before the call) and the MR's fields that do
 * not depend on keys or addresses. The VM case `conformance` runs it without the preload
 * and with it under every MRCACHE_REMOTE mode and requires the same output.
 *
 * What is printed for an MR: its addr as an offset into the buffer it was registered on
 * (or "abs" when outside it), its length, which of our PDs and contexts it names. Not
 * printed: lkey/rkey/handle (kernel object numbers; the cache's own objects shift them, a
 * window's rkey differs from the MR's) and pointer values.
 *
 * Left out (libibverbs alone is undefined there, nothing to compare): a second
 * ibv_dereg_mr of the same MR and a rereg after dereg (a use after free), use of an MR
 * after ibv_close_device of its context. Calls that crash libibverbs itself (a NULL pd, a
 * NULL mr to rereg) run in a child and print only how the child ended. */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define SENTINEL 4242
#define BUF (1u << 20)

static int seq;
static const char *who = "";
static struct ibv_context *ctx1, *ctx2;
static struct ibv_pd *pd1, *pd2, *pd3;
static char *buf, *buf2, *rdonly;

static const char *pd_name(struct ibv_pd *pd) {
    if (pd == pd1) return "pd1";
    if (pd == pd2) return "pd2";
    if (pd == pd3) return "pd3";
    return pd ? "other" : "NULL";
}

static const char *ctx_name(struct ibv_context *c) {
    if (c == ctx1) return "ctx1";
    if (c == ctx2) return "ctx2";
    return c ? "other" : "NULL";
}

static void where(char *out, size_t n, const void *p) {
    const char *c = p;
    if (c >= buf && c <= buf + BUF)
        snprintf(out, n, "buf+%#lx", (unsigned long)(c - buf));
    else if (c >= buf2 && c <= buf2 + BUF)
        snprintf(out, n, "buf2+%#lx", (unsigned long)(c - buf2));
    else if (c >= rdonly && c <= rdonly + BUF)
        snprintf(out, n, "rdonly+%#lx", (unsigned long)(c - rdonly));
    else
        snprintf(out, n, "abs");
}

static void line(const char *what, const char *result, int err) {
    char e[16];
    if (err == SENTINEL)
        snprintf(e, sizeof e, "untouched");
    else
        snprintf(e, sizeof e, "%d", err);
    printf("%s%03d %-58s -> %s errno=%s\n", who, ++seq, what, result, e);
    fflush(stdout);
}

static void mr_line(const char *what, struct ibv_mr *mr, int err) {
    char r[160], a[32];
    if (!mr) {
        line(what, "NULL", err);
        return;
    }
    where(a, sizeof a, mr->addr);
    snprintf(r, sizeof r, "mr{addr=%s len=%#zx pd=%s ctx=%s}", a, mr->length,
             pd_name(mr->pd), ctx_name(mr->context));
    line(what, r, err);
}

static void rc_line(const char *what, int rc, int err) {
    char r[32];
    snprintf(r, sizeof r, "rc=%d", rc);
    line(what, r, err);
}

#define DESC(...) (snprintf(d, sizeof d, __VA_ARGS__), d)

static struct ibv_mr *reg(struct ibv_pd *pd, void *addr, size_t len, int access) {
    char d[128], a[32];
    where(a, sizeof a, addr);
    errno = SENTINEL;
    struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, access);
    int e = errno;
    mr_line(DESC("reg_mr(%s,%s,%#zx,%#x)", pd_name(pd), a, len, access), mr, e);
    return mr;
}

static int dereg(struct ibv_mr *mr, const char *name) {
    char d[128];
    errno = SENTINEL;
    int rc = ibv_dereg_mr(mr);
    int e = errno;
    rc_line(DESC("dereg_mr(%s)", name), rc, e);
    return rc;
}

static int rereg(struct ibv_mr *mr, const char *name, int flags, struct ibv_pd *pd, void *addr,
                 size_t len, int access) {
    char d[160], a[32];
    where(a, sizeof a, addr);
    errno = SENTINEL;
    int rc = ibv_rereg_mr(mr, flags, pd, addr, len, access);
    int e = errno;
    rc_line(DESC("rereg_mr(%s,%#x,%s,%s,%#zx,%#x)", name, flags, pd_name(pd), addr ? a : "NULL",
                 len, access),
            rc, e);
    mr_line(DESC("  %s after rereg", name), mr, SENTINEL);
    return rc;
}

/* Run fn in a child (for calls that crash libibverbs itself): print how it ended. */
static void in_child(const char *what, void (*fn)(void)) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        fn();
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    char r[64];
    if (WIFSIGNALED(st))
        snprintf(r, sizeof r, "child killed by signal %d", WTERMSIG(st));
    else
        snprintf(r, sizeof r, "child exit %d", WEXITSTATUS(st));
    line(what, r, SENTINEL);
}

static void null_pd_reg(void) {
    struct ibv_mr *mr = ibv_reg_mr(NULL, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
    _exit(mr ? 3 : 4);
}

static void null_mr_rereg(void) {
    int rc = ibv_rereg_mr(NULL, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, 1);
    _exit(rc == 0 ? 3 : 4);
}

static void accesses(void) {
    /* Every combination of the five basic rights, registered and deregistered in turn, twice
     * over (the second round hits what the cache kept of the first). */
    for (int round = 0; round < 2; round++)
        for (int acc = 0; acc < 32; acc++) {
            struct ibv_mr *mr = reg(pd1, buf, BUF, acc);
            if (mr) dereg(mr, "mr");
        }
    /* Flags rxe refuses or the cache does not cache. */
    int odd[] = {IBV_ACCESS_ZERO_BASED | 1, IBV_ACCESS_ON_DEMAND | 1, IBV_ACCESS_HUGETLB | 1,
                 IBV_ACCESS_RELAXED_ORDERING | 1, IBV_ACCESS_RELAXED_ORDERING | 7, 1 << 15 | 1,
                 (int)(1u << 31) | 1, 1 << 8 | 1};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        struct ibv_mr *mr = reg(pd1, buf, BUF, odd[i]);
        if (mr) dereg(mr, "mr");
    }
}

static void lengths(void) {
    struct ibv_mr *mr;
    size_t lens[] = {0, 1, 4095, 4097, BUF - 1};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        for (int acc = 1; acc <= 7; acc += 6)
            if ((mr = reg(pd1, buf + 1, lens[i], acc))) dereg(mr, "mr");
    /* Huge and wrapping lengths, addresses nothing is mapped at. */
    if ((mr = reg(pd1, buf, (size_t)1 << 46, 1))) dereg(mr, "mr");
    if ((mr = reg(pd1, buf, SIZE_MAX - 4096, 1))) dereg(mr, "mr");
    if ((mr = reg(pd1, (void *)-4096L, 8192, 1))) dereg(mr, "mr");
    if ((mr = reg(pd1, NULL, 4096, 1))) dereg(mr, "mr");
    if ((mr = reg(pd1, (void *)0x10000, 4096, 7))) dereg(mr, "mr");
    /* Read-only memory: with and without write rights. */
    for (int acc = 0; acc <= 7; acc++)
        if ((mr = reg(pd1, rdonly, BUF, acc))) dereg(mr, "mr");
}

static void bad_pds(void) {
    struct ibv_mr *mr;
    /* A PD struct the kernel has no object for; a PD of the other context. */
    struct ibv_pd fake = {.context = ctx1, .handle = 0xdead};
    char d[64];
    errno = SENTINEL;
    mr = ibv_reg_mr(&fake, buf, 4096, 1);
    int e = errno;
    mr_line(DESC("reg_mr(fake pd,buf,0x1000,0x1)"), mr, e);
    if (mr) dereg(mr, "fake-pd mr");
    if ((mr = reg(pd3, buf, BUF, 7))) dereg(mr, "ctx2 mr");
    in_child("reg_mr(NULL pd) in a child", null_pd_reg);
}

static void iovas(void) {
    char d[128];
    uint64_t iv[] = {0, 1, 0x1001, (uintptr_t)buf + 1, (uintptr_t)buf, UINT64_MAX - 100,
                     (uint64_t)1 << 63};
    for (size_t i = 0; i < sizeof iv / sizeof iv[0]; i++)
        for (int which = 0; which < 2; which++) {
            errno = SENTINEL;
            struct ibv_mr *mr = which ? ibv_reg_mr_iova2(pd1, buf, BUF, iv[i], 7)
                                      : ibv_reg_mr_iova(pd1, buf, BUF, iv[i], 7);
            int e = errno;
            mr_line(DESC("reg_mr_iova%s(pd1,buf,%#x,iova#%zu,0x7)", which ? "2" : "", BUF, i), mr,
                    e);
            if (mr) dereg(mr, "mr");
        }
}

static void cross(void) {
    /* The same buffer on two PDs of one context and on the other context, live together,
     * deregistered in another order; hits of a live registration. */
    struct ibv_mr *a = reg(pd1, buf, BUF, 7);
    struct ibv_mr *b = reg(pd2, buf, BUF, 7);
    struct ibv_mr *c = reg(pd3, buf, BUF, 7);
    struct ibv_mr *a2 = reg(pd1, buf, BUF, 7);
    struct ibv_mr *a3 = reg(pd1, buf + 4096, 4096, 1);
    printf("%s    distinct pointers: %d\n", who, a != a2 && a != a3 && a2 != a3);
    if (c) dereg(c, "c(pd3)");
    if (a) dereg(a, "a(pd1)");
    if (b) dereg(b, "b(pd2)");
    if (a3) dereg(a3, "a3(pd1 sub)");
    if (a2) dereg(a2, "a2(pd1)");
}

static void reregs(void) {
    int accs[] = {1, 3, 7, 15, 17};
    for (size_t i = 0; i < sizeof accs / sizeof accs[0]; i++) {
        /* Each flag combination, and bad ones, on a registration of its own... */
        for (int flags = 0; flags <= 8; flags++) {
            struct ibv_mr *mr = reg(pd1, buf, BUF, accs[i]);
            if (!mr) continue;
            int acc = flags & IBV_REREG_MR_CHANGE_ACCESS ? 7 : 0;
            rereg(mr, "mr", flags, flags & IBV_REREG_MR_CHANGE_PD ? pd2 : NULL,
                  flags & IBV_REREG_MR_CHANGE_TRANSLATION ? buf2 : NULL,
                  flags & IBV_REREG_MR_CHANGE_TRANSLATION ? BUF : 0, acc);
            dereg(mr, "mr");
        }
        /* ...and on one of two live registrations of the same range. */
        struct ibv_mr *x = reg(pd1, buf, BUF, accs[i]);
        struct ibv_mr *y = reg(pd1, buf, BUF, accs[i]);
        if (x && y) {
            rereg(y, "y", IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, 1);
            rereg(y, "y", IBV_REREG_MR_CHANGE_TRANSLATION, NULL, buf2, BUF, 0);
            rereg(x, "x", IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0);
        }
        if (y) dereg(y, "y");
        if (x) dereg(x, "x");
    }
    /* Bad arguments. */
    struct ibv_mr *mr = reg(pd1, buf, BUF, 3);
    if (mr) {
        rereg(mr, "mr", -1, NULL, NULL, 0, 0);
        rereg(mr, "mr", IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, BUF, 0);
        rereg(mr, "mr", IBV_REREG_MR_CHANGE_TRANSLATION, NULL, buf2, 0, 0);
        rereg(mr, "mr", IBV_REREG_MR_CHANGE_PD, NULL, NULL, 0, 3);
        rereg(mr, "mr", IBV_REREG_MR_CHANGE_PD, pd3, NULL, 0, 0);
        rereg(mr, "mr", IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, -1);
        rereg(mr, "mr", IBV_REREG_MR_CHANGE_TRANSLATION, NULL, (void *)0x10000, 4096, 0);
        dereg(mr, "mr");
    }
    in_child("rereg_mr(NULL) in a child", null_mr_rereg);
}

static void dmabuf(void) {
    char d[96];
    int fds[] = {-1, open("/dev/null", O_RDONLY), 9999};
    for (int i = 0; i < 3; i++) {
        errno = SENTINEL;
        struct ibv_mr *mr = ibv_reg_dmabuf_mr(pd1, 0, 4096, 0, fds[i], 1);
        int e = errno;
        mr_line(DESC("reg_dmabuf_mr(pd1,0,0x1000,0,fd#%d,0x1)", i), mr, e);
        if (mr) dereg(mr, "dmabuf mr");
    }
    close(fds[1]);
}

static void dealloc_close(void) {
    char d[64];
    struct ibv_pd *p = ibv_alloc_pd(ctx1);
    struct ibv_mr *live = reg(p, buf, BUF, 7);
    struct ibv_mr *gone = reg(p, buf2, BUF, 1);
    if (gone) dereg(gone, "gone");
    errno = SENTINEL;
    int rc = ibv_dealloc_pd(p);
    int e = errno;
    rc_line(DESC("dealloc_pd(p) with one MR alive"), rc, e);
    if (rc == 0) return; /* freed: nothing more to call on it */
    if (live) dereg(live, "live");
    errno = SENTINEL;
    rc = ibv_dealloc_pd(p);
    e = errno;
    rc_line(DESC("dealloc_pd(p) with none alive"), rc, e);
}

static void forked(void) {
    struct ibv_mr *p = reg(pd1, buf, BUF, 7);
    struct ibv_mr *q = reg(pd1, buf2, BUF, 1);
    if (q) dereg(q, "q");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        who = "child ";
        struct ibv_mr *c = reg(pd1, buf2, BUF, 1);
        if (c) dereg(c, "c");
        if (p) rereg(p, "parent's p", IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, 1);
        fflush(stdout);
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    seq += 1000;
    printf("child exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    struct ibv_mr *r = reg(pd1, buf2, BUF, 1);
    if (r) dereg(r, "r");
    if (p) rereg(p, "p", IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, 1);
    if (p) dereg(p, "p");
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    const char *want = getenv("MRCACHE_TEST_DEVICE") ? getenv("MRCACHE_TEST_DEVICE") : "rxe0";
    struct ibv_device *dev = NULL;
    for (int i = 0; i < n; i++)
        if (!strcmp(ibv_get_device_name(list[i]), want)) dev = list[i];
    if (!dev) {
        fprintf(stderr, "conformance: no device %s\n", want);
        return 2;
    }
    ctx1 = ibv_open_device(dev);
    ctx2 = ibv_open_device(dev);
    pd1 = ctx1 ? ibv_alloc_pd(ctx1) : NULL;
    pd2 = ctx1 ? ibv_alloc_pd(ctx1) : NULL;
    pd3 = ctx2 ? ibv_alloc_pd(ctx2) : NULL;
    if (!pd1 || !pd2 || !pd3) {
        fprintf(stderr, "conformance: cannot open %s twice with PDs\n", want);
        return 2;
    }
    buf = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    buf2 = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    rdonly = mmap(NULL, BUF, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(buf, 1, BUF);
    memset(buf2, 2, BUF);

    /* Sections in this order (argv: a subset, for a closer look). rereg comes first: a
     * failed window bind (the cache's, in MRCACHE_REMOTE=revoke) would leave later remote
     * registrations of pd1 to libibverbs, and the rereg of a window's handle untested. */
    static const struct {
        const char *name;
        void (*fn)(void);
    } sections[] = {{"rereg", reregs},     {"access", accesses}, {"lengths", lengths},
                    {"pds", bad_pds},      {"iova", iovas},      {"cross", cross},
                    {"dmabuf", dmabuf},    {"dealloc_pd", dealloc_close},
                    {"fork", forked}};
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++) {
        int run = argc < 2;
        for (int a = 1; a < argc; a++) run |= !strcmp(argv[a], sections[i].name);
        if (!run) continue;
        printf("== %s\n", sections[i].name);
        sections[i].fn();
    }

    printf("== close_device\n");
    char d[64];
    struct ibv_mr *left = reg(pd3, buf, BUF, 7);
    (void)left; /* alive at the close: never touched again */
    errno = SENTINEL;
    int rc = ibv_close_device(ctx2);
    int e = errno;
    rc_line(DESC("close_device(ctx2) with an MR and a PD alive"), rc, e);
    errno = SENTINEL;
    rc = ibv_dealloc_pd(pd2);
    e = errno;
    rc_line(DESC("dealloc_pd(pd2)"), rc, e);
    errno = SENTINEL;
    rc = ibv_dealloc_pd(pd1);
    e = errno;
    rc_line(DESC("dealloc_pd(pd1)"), rc, e);
    errno = SENTINEL;
    rc = ibv_close_device(ctx1);
    e = errno;
    rc_line(DESC("close_device(ctx1)"), rc, e);
    ibv_free_device_list(list);
    printf("== end\n");
    return 0;
}
