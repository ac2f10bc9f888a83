/* Differential fuzzer: a seeded random sequence of memory and verbs operations on rxe whose
 * log must be the same line for line without the preload (libibverbs alone) and behind
 * libmrcache.so in every configuration.
 *
 *   differential run SEED [--n=N] [--ops=LIST] [--late=skip]
 *       one sequence; one log line per operation on stdout
 *   differential compare [--n=N] [--ops=LIST] [--configs=LIST] [--timeout=S] SEED...
 *       runs each seed without the preload, then under each configuration with
 *       LD_PRELOAD=$MRCACHE_PRELOAD, and requires the same log; prints the first differing
 *       line, the seed, the configuration and the command that reproduces it alone
 *   differential configs
 *       lists the configurations (name and environment)
 *
 * Operations (LIST: names to run only those, or -NAME,... to leave those out of all):
 * mmap (private, shared, memfd), malloc, realloc, free, trim (malloc_trim), munmap (whole or
 * part), mremap (grow and move with MREMAP_MAYMOVE, shrink), madvise (DONTNEED, FREE,
 * REMOVE), map_fixed (over part of a region), reg (ibv_reg_mr, ibv_reg_mr_iova,
 * ibv_reg_mr_iova2; 16 access sets), dereg, rereg (flags 0-7 and an invalid bit), prove (a
 * live registration again, while its memory is untouched), late (an RDMA op with a dead
 * key), fork and _fork (a child registering an inherited buffer), mprotect (PROT_READ,
 * PROT_NONE, back to read-write), memlock (RLIMIT_MEMLOCK; with it in LIST the run drops
 * CAP_IPC_LOCK and starts at a 4 MiB limit).
 *
 * Every registration is proven through its keys over a loopback RC QP on the same device:
 * L the lkey as the source of an RDMA WRITE (the NIC reads the region), W the lkey as the
 * sink of an RDMA READ (LOCAL_WRITE), RW an RDMA WRITE through the rkey (REMOTE_WRITE), RR an
 * RDMA READ through it (REMOTE_READ), FA a fetch-and-add on a word of it (REMOTE_ATOMIC); each
 * with fresh data checked against what the CPU sees. A key is dead once deregistered: a
 * late op through it must complete in error and leave the memory as it was.
 *
 * What the log holds is normalised: regions, registrations and dead keys by number,
 * addresses as offsets into their region, no key, pointer or placement. Known
 * nondeterminism kept out: mremap grows only with MREMAP_MAYMOVE (in place depends on the
 * layout, which the preload changes), iovas at the page offset of their address, nothing
 * registered across a hole (the kernel may map anything there), malloc_trim's result. */
#include "lib/loopback.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <malloc.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PG 4096ul
#define MAXPG 512
#define NREG 12
#define NH 16
#define NDEAD 8
#define NHIST 8
#define CHUNK (32ul << 10)
#define SCRATCH (256ul << 10)
#define MiB (1ul << 20)

/* ---------------------------------------------------------------- options, operations */

enum op {
    O_MMAP, O_MALLOC, O_REALLOC, O_FREE, O_TRIM, O_MUNMAP, O_MREMAP, O_MADVISE, O_MAP_FIXED,
    O_REG, O_DEREG, O_REREG, O_PROVE, O_LATE, O_FORK, O_UFORK, O_MPROTECT, O_MEMLOCK, O_N
};
static const char *op_names[O_N] = {"mmap",  "malloc",    "realloc", "free",  "trim",
                                    "munmap", "mremap",   "madvise", "map_fixed", "reg",
                                    "dereg", "rereg",     "prove",   "late",  "fork",
                                    "_fork", "mprotect",  "memlock"};
static const int op_weight[O_N] = {8, 6, 3, 3, 1, 4, 3, 4, 3, 22, 13, 5, 6, 5, 2, 2, 5, 2};
static int op_on[O_N];

static int parse_ops(const char *s) {
    for (int i = 0; i < O_N; i++)
        op_on[i] = !s || *s == '-';
    if (!s)
        return 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        int on = *t != '-';
        const char *name = *t == '-' || *t == '+' ? t + 1 : t;
        int i = 0;
        while (i < O_N && strcmp(op_names[i], name))
            i++;
        if (i == O_N) {
            fprintf(stderr, "differential: --ops: unknown operation '%s'; allowed:", name);
            for (int j = 0; j < O_N; j++)
                fprintf(stderr, " %s", op_names[j]);
            fprintf(stderr, " (NAME,... or -NAME,...)\n");
            return -1;
        }
        op_on[i] = on;
    }
    return 0;
}

/* ---------------------------------------------------------------- the random stream */

static uint64_t rs;
static uint64_t rnd(void) {
    rs ^= rs >> 12;
    rs ^= rs << 25;
    rs ^= rs >> 27;
    return rs * 0x2545F4914F6CDD1Dull;
}
static size_t rn(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

/* ---------------------------------------------------------------- the log */

static int opno;
static unsigned long n_regs, n_proofs, n_late, n_children;
static char line[1024];
static size_t linelen;

static void add(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void add(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (linelen < sizeof line)
        linelen += (size_t)vsnprintf(line + linelen, sizeof line - linelen, fmt, ap);
    va_end(ap);
}
static void begin(const char *name) {
    linelen = 0;
    add("%d %s", opno, name);
}
static void end(void) {
    printf("%s\n", line);
    linelen = 0;
}

/* ---------------------------------------------------------------- the rig: QPs and scratch */

struct rig {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp[2];
    union ibv_gid gid;
    enum ibv_mtu mtu;
    unsigned char *scratch;
    struct ibv_mr *smr;
};
static struct rig rig;

/* RESET to RTS: 0 or the failed step's errno. */
static int qp_connect(struct rig *g, struct ibv_qp *qp, uint32_t dest) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
                            .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                               IBV_ACCESS_REMOTE_ATOMIC};
    int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                       IBV_QP_ACCESS_FLAGS);
    if (rc)
        return rc;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = g->mtu;
    a.dest_qp_num = dest;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = g->gid;
    a.ah_attr.grh.sgid_index = 1;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc)
        return rc;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14; /* timeout 10 with retry 2 gave RETRY_EXC_ERR under TCG load */
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* Make the QP pair and connect it (RESET to RTS). 0, or -1 with the failed step on stderr. */
static int rig_qps(struct rig *g) {
    for (int i = 0; i < 2; i++) {
        struct ibv_qp_init_attr qa = {.send_cq = g->cq, .recv_cq = g->cq, .qp_type = IBV_QPT_RC,
                                      .cap = {.max_send_wr = 8, .max_recv_wr = 8,
                                              .max_send_sge = 1, .max_recv_sge = 1}};
        if (!(g->qp[i] = ibv_create_qp(g->pd, &qa))) {
            fprintf(stderr, "differential: ibv_create_qp: %s\n", strerror(errno));
            return -1;
        }
    }
    for (int i = 0; i < 2; i++) {
        int rc = qp_connect(g, g->qp[i], g->qp[1 - i]->qp_num);
        if (rc) {
            fprintf(stderr, "differential: QP %d from RESET to RTS: %s\n", i, strerror(rc));
            return -1;
        }
    }
    return 0;
}

/* After a failed work request: a new QP pair in place of the old one. rxe hands out a failed
 * completion before it moves the QPs to the error state (lb_await_error_state), and a reset
 * QP pair can still be moved to ERR by what the failure left pending; new QPs share nothing
 * with the failed pair but the CQ, where post() skips other work requests' completions. */
static int rig_renew(struct rig *g) {
    for (int i = 0; i < 2; i++) {
        if (g->qp[i] && ibv_destroy_qp(g->qp[i]))
            fprintf(stderr, "differential: ibv_destroy_qp: %s\n", strerror(errno));
        g->qp[i] = NULL;
    }
    struct ibv_wc wc[16];
    while (ibv_poll_cq(g->cq, 16, wc) > 0) {
    }
    return rig_qps(g);
}

static int rig_open(struct rig *g) {
    memset(g, 0, sizeof *g);
    const char *dev = getenv("MRCACHE_TEST_DEVICE");
    if (!dev)
        dev = "rxe0";
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    for (int i = 0; list && i < n && !g->ctx; i++)
        if (!strcmp(ibv_get_device_name(list[i]), dev))
            g->ctx = ibv_open_device(list[i]);
    if (list)
        ibv_free_device_list(list);
    if (!g->ctx)
        return -1;
    struct ibv_port_attr port;
    if (ibv_query_port(g->ctx, 1, &port) || ibv_query_gid(g->ctx, 1, 1, &g->gid))
        return -1;
    g->mtu = port.active_mtu;
    g->pd = ibv_alloc_pd(g->ctx);
    g->cq = g->pd ? ibv_create_cq(g->ctx, 32, NULL, NULL, 0) : NULL;
    if (!g->cq)
        return -1;
    if (rig_qps(g))
        return -1;
    g->scratch = mmap(NULL, SCRATCH, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g->scratch == MAP_FAILED)
        return -1;
    g->smr = ibv_reg_mr(g->pd, g->scratch, SCRATCH,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                            IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
    return g->smr ? 0 : -1;
}

static void rig_close(struct rig *g) {
    if (g->smr)
        ibv_dereg_mr(g->smr);
    for (int i = 0; i < 2; i++)
        if (g->qp[i])
            ibv_destroy_qp(g->qp[i]);
    if (g->cq)
        ibv_destroy_cq(g->cq);
    if (g->pd)
        ibv_dealloc_pd(g->pd);
    if (g->ctx)
        ibv_close_device(g->ctx);
}

/* One work request from qp[0], waited for. 0, 1000 + the failed completion's status (a new
 * QP pair replaces the failed one), or an errno. */
static int post(struct rig *g, enum ibv_wr_opcode op, void *local, size_t len, uint32_t lkey,
                uint64_t raddr, uint32_t rkey, uint64_t add_value) {
    struct ibv_sge sge = {.addr = (uintptr_t)local, .length = (uint32_t)len, .lkey = lkey};
    static uint64_t posts;
    struct ibv_send_wr wr = {.wr_id = ++posts, .sg_list = &sge, .num_sge = 1, .opcode = op,
                             .send_flags = IBV_SEND_SIGNALED};
    if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
        wr.wr.atomic.remote_addr = raddr;
        wr.wr.atomic.rkey = rkey;
        wr.wr.atomic.compare_add = add_value;
    } else {
        wr.wr.rdma.remote_addr = raddr;
        wr.wr.rdma.rkey = rkey;
    }
    if ((!g->qp[0] || !g->qp[1]) && rig_renew(g)) /* the last renewal failed */
        return EIO;
    struct ibv_send_wr *bad;
    int rc = ibv_post_send(g->qp[0], &wr, &bad);
    if (rc) {
        rig_renew(g);
        return rc;
    }
    struct ibv_wc wc;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int n = ibv_poll_cq(g->cq, 1, &wc);
        if (n < 0)
            return EIO;
        if (n == 1 && wc.wr_id == wr.wr_id)
            break;
        if (n == 1)
            fprintf(stderr, "differential: skipped a completion of another work request (%llu, "
                            "status %d) waiting for %llu\n", (unsigned long long)wc.wr_id,
                    (int)wc.status, (unsigned long long)wr.wr_id);
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 30) {
            rig_renew(g);
            return ETIMEDOUT;
        }
    }
    if (wc.status == IBV_WC_SUCCESS)
        return 0;
    if (rig_renew(g))
        fprintf(stderr, "differential: cannot make a new QP pair\n");
    return 1000 + (int)wc.status;
}

/* ---------------------------------------------------------------- the memory model */

enum kind { K_PRIV, K_SHARED, K_MEMFD, K_MALLOC };
static const char *kind_names[] = {"private", "shared", "memfd", "malloc"};
enum { P_MAP = 1, P_R = 2, P_W = 4, P_RW = 7 };

struct region {
    int live, id, kind, fd, simple;
    unsigned gen; /* moves whenever its memory changes under a live registration */
    char *base;
    size_t len;
    unsigned char pg[MAXPG];
};
static struct region regs[NREG];
static int next_region;
static unsigned gens; /* every region's generation is new: a reused slot never matches */

struct handle {
    int live, id, reg, access, via, prove_ok;
    unsigned gen;
    size_t off, len;
    uint64_t iova;
    struct ibv_mr *mr;
};
static struct handle hs[NH];
static int next_handle;

struct dead {
    int live, id, reg, access;
    unsigned gen;
    size_t off, len;
    uint64_t raddr;
    uint32_t rkey;
};
static struct dead deads[NDEAD];
static int next_dead;

struct hist {
    int used, reg, rid, access, via;
    size_t off, len;
    uint64_t iova_page;
};
static struct hist hist[NHIST];

static int late_skip; /* MRCACHE_REMOTE=keep keeps dead rkeys reaching memory by design */

static size_t npages(const struct region *r) { return (r->len + PG - 1) / PG; }

/* The state every byte of [off, off+len) has (malloc'd memory is always read-write). */
static int state(const struct region *r, size_t off, size_t len) {
    if (off + len > r->len)
        return 0;
    if (r->kind == K_MALLOC)
        return P_RW;
    int s = P_RW;
    for (size_t p = off / PG; p < npages(r) && p * PG < off + len; p++)
        s &= r->pg[p];
    return s;
}

static void set_pages(struct region *r, size_t p0, size_t n, int s) {
    for (size_t p = p0; p < p0 + n && p < MAXPG; p++)
        r->pg[p] = (unsigned char)s;
}

static int pick_region(int malloc_ok, int mmap_ok) {
    int c[NREG], n = 0;
    for (int i = 0; i < NREG; i++)
        if (regs[i].live && (regs[i].kind == K_MALLOC ? malloc_ok : mmap_ok))
            c[n++] = i;
    return n ? c[rn((size_t)n)] : -1;
}

static int free_region_slot(void) {
    for (int i = 0; i < NREG; i++)
        if (!regs[i].live)
            return i;
    return -1;
}

/* A run of mapped pages of r: [*p0, *p0 + *n). 0 if r has none. */
static int mapped_run(const struct region *r, size_t *p0, size_t *n) {
    size_t np = npages(r), start = rn(np);
    for (size_t k = 0; k < np; k++) {
        size_t p = (start + k) % np;
        if (r->pg[p] & P_MAP) {
            size_t a = p, b = p;
            while (a > 0 && (r->pg[a - 1] & P_MAP))
                a--;
            while (b + 1 < np && (r->pg[b + 1] & P_MAP))
                b++;
            *p0 = a;
            *n = b - a + 1;
            return 1;
        }
    }
    return 0;
}

/* A random byte range inside mapped memory of region ri; 0 if none. */
static int pick_range(int ri, size_t *off, size_t *len) {
    struct region *r = &regs[ri];
    size_t lo = 0, hi = r->len;
    if (r->kind != K_MALLOC) {
        size_t p0, n;
        if (!mapped_run(r, &p0, &n))
            return 0;
        lo = p0 * PG;
        hi = (p0 + n) * PG;
    }
    size_t span = hi - lo;
    switch (rn(4)) {
    case 0: /* the whole run */
        *off = lo;
        *len = span;
        break;
    case 1: { /* whole pages */
        size_t np = (span + PG - 1) / PG, a = rn(np), b = a + 1 + rn(np - a);
        *off = lo + a * PG;
        *len = (b * PG < span ? b * PG : span) - a * PG;
        break;
    }
    default: { /* any bytes */
        size_t a = rn(span), l = 1 + rn(span - a);
        *off = lo + a;
        *len = l;
    }
    }
    return *len > 0;
}

static void fill(unsigned char *p, size_t len, unsigned seed) { lb_fill(p, len, seed); }

/* Fill a new or grown range of a region with data (touches its pages). */
static void touch(struct region *r, size_t off, size_t len) {
    if (state(r, off, len) == P_RW)
        fill((unsigned char *)r->base + off, len, (unsigned)opno);
}

/* ---------------------------------------------------------------- proofs */

static const char *res(int rc, int data_ok) {
    static char b[8][16];
    static int k;
    char *s = b[k++ % 8];
    if (rc)
        snprintf(s, 16, "wc%d", rc >= 1000 ? rc - 1000 : -rc);
    else
        snprintf(s, 16, "%s", data_ok ? "ok" : "BAD");
    return s;
}

/* Prove a registration on [r->base+off, +len) (local keys and, with access, remote ones). */
static void prove(struct rig *g, struct ibv_mr *mr, struct region *r, size_t off, size_t len,
                  int access, uint64_t iova, unsigned salt) {
    size_t chunks[2][2] = {{off, len < CHUNK ? len : CHUNK}, {0, 0}};
    if (len > CHUNK) {
        size_t el = len - CHUNK < PG ? len - CHUNK : PG;
        chunks[1][0] = off + len - el;
        chunks[1][1] = el;
    }
    int lr = 0, lw = 0, rw = 0, rr = 0, fa = 0, ok_l = 1, ok_w = 1, ok_rw = 1, ok_rr = 1,
        ok_fa = 1;
    for (int c = 0; c < 2 && chunks[c][1]; c++) {
        size_t co = chunks[c][0], cl = chunks[c][1];
        unsigned char *p = (unsigned char *)r->base + co;
        uint64_t raddr = iova + (co - off);
        int st = state(r, co, cl);
        unsigned s0 = salt * 16 + (unsigned)c * 8;
        /* L: the NIC reads the region through the lkey. */
        if (st & P_W)
            fill(p, cl, s0);
        memset(g->scratch, 0, cl);
        /* the lkey, like the rkey, addresses the MR's iova space */
        void *la = (void *)(uintptr_t)raddr;
        uint64_t sa = (uintptr_t)g->scratch;
        int rc = post(g, IBV_WR_RDMA_WRITE, la, cl, mr->lkey, sa, g->smr->rkey, 0);
        n_proofs++;
        lr = lr ? lr : rc;
        if (!rc && (st & P_R) && memcmp(g->scratch, p, cl))
            ok_l = 0;
        /* W: the NIC writes the region through the lkey. */
        if (access & IBV_ACCESS_LOCAL_WRITE) {
            fill(g->scratch, cl, s0 + 1);
            rc = post(g, IBV_WR_RDMA_READ, la, cl, mr->lkey, sa, g->smr->rkey, 0);
            n_proofs++;
            lw = lw ? lw : rc;
            if (!rc && (st & P_R) && memcmp(g->scratch, p, cl))
                ok_w = 0;
        }
        if (access & IBV_ACCESS_REMOTE_WRITE) {
            fill(g->scratch, cl, s0 + 2);
            rc = post(g, IBV_WR_RDMA_WRITE, g->scratch, cl, g->smr->lkey, raddr, mr->rkey, 0);
            n_proofs++;
            rw = rw ? rw : rc;
            if (!rc && (st & P_R) && memcmp(g->scratch, p, cl))
                ok_rw = 0;
        }
        if (access & IBV_ACCESS_REMOTE_READ) {
            if (st & P_W)
                fill(p, cl, s0 + 3);
            memset(g->scratch, 0, cl);
            rc = post(g, IBV_WR_RDMA_READ, g->scratch, cl, g->smr->lkey, raddr, mr->rkey, 0);
            n_proofs++;
            rr = rr ? rr : rc;
            if (!rc && (st & P_R) && memcmp(g->scratch, p, cl))
                ok_rr = 0;
        }
        uintptr_t w = ((uintptr_t)p + 7) & ~(uintptr_t)7;
        if ((access & IBV_ACCESS_REMOTE_ATOMIC) && w + 8 <= (uintptr_t)p + cl) {
            uint64_t v = 0x1000 + salt, a = 7 + (uint64_t)c, got;
            if (st & P_W)
                memcpy((void *)w, &v, 8);
            else if (st & P_R)
                memcpy(&v, (void *)w, 8);
            memset(g->scratch, 0, 8);
            rc = post(g, IBV_WR_ATOMIC_FETCH_AND_ADD, g->scratch, 8, g->smr->lkey,
                      raddr + (w - (uintptr_t)p), mr->rkey, a);
            n_proofs++;
            fa = fa ? fa : rc;
            memcpy(&got, g->scratch, 8);
            if (!rc && (st & P_R)) {
                uint64_t now;
                memcpy(&now, (void *)w, 8);
                if (got != v || now != v + a)
                    ok_fa = 0;
            }
        }
    }
    add(" | L=%s", res(lr, ok_l));
    if (access & IBV_ACCESS_LOCAL_WRITE)
        add(" W=%s", res(lw, ok_w));
    if (access & IBV_ACCESS_REMOTE_WRITE)
        add(" RW=%s", res(rw, ok_rw));
    if (access & IBV_ACCESS_REMOTE_READ)
        add(" RR=%s", res(rr, ok_rr));
    if (access & IBV_ACCESS_REMOTE_ATOMIC)
        add(" FA=%s", res(fa, ok_fa));
}

/* ---------------------------------------------------------------- operations */

static void region_gone(struct region *r) {
    if (r->fd >= 0)
        close(r->fd);
    r->live = 0;
    r->gen = ++gens;
}

static void op_free(void);
static void op_munmap_whole(int whole);

static void retire(void) {
    linelen = 0;
    if (rn(2))
        op_free();
    else
        op_munmap_whole(1);
}

static void op_mmap(void) {
    int i = free_region_slot();
    int kind = (int)rn(3);
    size_t np = rn(10) ? 1 + rn(64) : 65 + rn(MAXPG - 64);
    begin("mmap");
    if (i < 0) /* every slot taken: retire a region instead */
        return retire();
    add(" r%d %s %zup", next_region, kind_names[kind], np);
    struct region *r = &regs[i];
    memset(r, 0, sizeof *r);
    r->fd = -1;
    r->kind = kind;
    r->len = np * PG;
    int flags = kind == K_PRIV ? MAP_PRIVATE | MAP_ANONYMOUS : MAP_SHARED;
    if (kind == K_SHARED)
        flags |= MAP_ANONYMOUS;
    if (kind == K_MEMFD) {
        r->fd = memfd_create("differential", 0);
        if (r->fd < 0 || ftruncate(r->fd, (off_t)r->len)) {
            add(" -> memfd errno=%d", errno);
            return end();
        }
    }
    errno = 0;
    void *p = mmap(NULL, r->len, PROT_READ | PROT_WRITE, flags, r->fd, 0);
    if (p == MAP_FAILED) {
        add(" -> errno=%d", errno);
        if (r->fd >= 0)
            close(r->fd);
        return end();
    }
    r->base = p;
    r->live = 1;
    r->simple = 1;
    r->gen = ++gens;
    r->id = next_region++;
    set_pages(r, 0, np, P_RW);
    touch(r, 0, r->len);
    add(" -> ok");
    end();
}

static void op_malloc(void) {
    int i = free_region_slot();
    size_t sz = rn(3) == 0 ? 1 + rn(4096) : rn(2) ? 4096 + rn(128 << 10) : (128 << 10) + rn(MiB);
    begin("malloc");
    if (i < 0)
        return retire();
    add(" r%d %zu", next_region, sz);
    struct region *r = &regs[i];
    memset(r, 0, sizeof *r);
    r->fd = -1;
    r->kind = K_MALLOC;
    r->base = malloc(sz);
    if (!r->base) {
        add(" -> NULL");
        return end();
    }
    r->len = sz;
    r->live = 1;
    r->gen = ++gens;
    r->id = next_region++;
    touch(r, 0, sz);
    add(" -> ok");
    end();
}

static void op_realloc(void) {
    int i = pick_region(1, 0);
    size_t sz = rn(2) ? 1 + rn(64 << 10) : 1 + rn(MiB);
    begin("realloc");
    if (i < 0)
        return end();
    struct region *r = &regs[i];
    add(" r%d %zu", r->id, sz);
    char *p = realloc(r->base, sz);
    if (!p) {
        add(" -> NULL");
        return end();
    }
    if (sz > r->len)
        fill((unsigned char *)p + r->len, sz - r->len, (unsigned)opno);
    r->base = p;
    r->len = sz;
    r->gen = ++gens;
    add(" -> ok");
    end();
}

static void op_free(void) {
    int i = pick_region(1, 0);
    begin("free");
    if (i < 0)
        return end();
    add(" r%d", regs[i].id);
    free(regs[i].base);
    region_gone(&regs[i]);
    end();
}

static void op_trim(void) {
    begin("trim");
    malloc_trim(0); /* its result depends on the preload's own allocations */
    end();
}

static void op_munmap(void) { op_munmap_whole(rn(3) == 0); }

static void op_munmap_whole(int whole) {
    int i = pick_region(0, 1);
    begin("munmap");
    if (i < 0)
        return end();
    struct region *r = &regs[i];
    size_t p0, n;
    if (!mapped_run(r, &p0, &n))
        return end();
    if (!whole) {
        size_t a = rn(n), b = a + 1 + rn(n - a);
        p0 += a;
        n = b - a;
    }
    add(" r%d %s", r->id, whole ? "all" : "part");
    if (whole) { /* every mapped run: never a foreign mapping in a hole */
        for (size_t p = 0; p < npages(r); p++)
            if (r->pg[p] & P_MAP) {
                size_t q = p;
                while (q < npages(r) && (r->pg[q] & P_MAP))
                    q++;
                if (munmap(r->base + p * PG, (q - p) * PG))
                    add(" errno=%d", errno);
                p = q;
            }
        region_gone(r);
        add(" -> ok");
        return end();
    }
    add(" +%zup %zup", p0, n);
    errno = 0;
    int rc = munmap(r->base + p0 * PG, n * PG);
    add(" -> %d errno=%d", rc, rc ? errno : 0);
    if (!rc) {
        set_pages(r, p0, n, 0);
        r->simple = 0;
        r->gen = ++gens;
        int any = 0;
        for (size_t p = 0; p < npages(r); p++)
            any |= r->pg[p] & P_MAP;
        if (!any)
            region_gone(r);
    }
    end();
}

static void op_mremap(void) {
    int c[NREG], nc = 0;
    for (int i = 0; i < NREG; i++)
        if (regs[i].live && regs[i].simple && regs[i].kind != K_MALLOC)
            c[nc++] = i;
    int how = (int)rn(3); /* grow, shrink, move */
    begin("mremap");
    if (!nc)
        return end();
    struct region *r = &regs[c[rn((size_t)nc)]];
    size_t np = npages(r), nn = np;
    if (how == 0 && (r->kind == K_SHARED || np >= MAXPG))
        how = 1; /* a shared anonymous object cannot grow */
    if (how == 1 && np < 2)
        how = 2;
    if (how == 0)
        nn = np + 1 + rn(MAXPG - np < 64 ? MAXPG - np : 64);
    else if (how == 1)
        nn = 1 + rn(np - 1);
    add(" r%d %s %zup->%zup", r->id, how == 0 ? "grow" : how == 1 ? "shrink" : "move", np, nn);
    if (how == 0 && r->kind == K_MEMFD && ftruncate(r->fd, (off_t)(nn * PG))) {
        add(" -> ftruncate errno=%d", errno);
        return end();
    }
    void *p;
    errno = 0;
    if (how == 2) {
        void *to = mmap(NULL, np * PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        p = to == MAP_FAILED ? to
                             : mremap(r->base, np * PG, np * PG, MREMAP_MAYMOVE | MREMAP_FIXED, to);
    } else {
        p = mremap(r->base, np * PG, nn * PG, how == 0 ? MREMAP_MAYMOVE : 0);
    }
    if (p == MAP_FAILED) {
        add(" -> errno=%d", errno);
        return end();
    }
    r->base = p;
    r->len = nn * PG;
    r->gen = ++gens;
    if (nn > np) {
        set_pages(r, np, nn - np, P_RW);
        touch(r, np * PG, (nn - np) * PG);
    }
    add(" -> ok");
    end();
}

static void op_madvise(void) {
    static const int adv[] = {MADV_DONTNEED, MADV_FREE, MADV_REMOVE};
    static const char *names[] = {"DONTNEED", "FREE", "REMOVE"};
    int i = pick_region(0, 1), a = (int)rn(3);
    begin("madvise");
    if (i < 0)
        return end();
    struct region *r = &regs[i];
    size_t p0, n;
    if (!mapped_run(r, &p0, &n))
        return end();
    size_t x = rn(n), y = x + 1 + rn(n - x);
    add(" r%d +%zup %zup %s", r->id, p0 + x, y - x, names[a]);
    errno = 0;
    int rc = madvise(r->base + (p0 + x) * PG, (y - x) * PG, adv[a]);
    add(" -> %d errno=%d", rc, rc ? errno : 0);
    r->gen = ++gens;
    end();
}

static void op_map_fixed(void) {
    int i = pick_region(0, 1), shared = (int)rn(2);
    begin("map_fixed");
    if (i < 0)
        return end();
    struct region *r = &regs[i];
    size_t p0, n;
    if (!mapped_run(r, &p0, &n))
        return end();
    size_t x = rn(n), y = x + 1 + rn(n - x);
    add(" r%d +%zup %zup %s", r->id, p0 + x, y - x, shared ? "shared" : "private");
    errno = 0;
    void *p = mmap(r->base + (p0 + x) * PG, (y - x) * PG, PROT_READ | PROT_WRITE,
                   MAP_FIXED | MAP_ANONYMOUS | (shared ? MAP_SHARED : MAP_PRIVATE), -1, 0);
    add(" -> %s errno=%d", p == MAP_FAILED ? "failed" : "ok", p == MAP_FAILED ? errno : 0);
    if (p != MAP_FAILED) {
        set_pages(r, p0 + x, y - x, P_RW);
        touch(r, (p0 + x) * PG, (y - x) * PG);
        r->simple = 0;
        r->gen = ++gens;
    }
    end();
}

static void op_mprotect(void) {
    static const int prots[] = {PROT_READ, PROT_NONE, PROT_READ | PROT_WRITE};
    static const int states[] = {P_MAP | P_R, P_MAP, P_RW};
    static const char *names[] = {"READ", "NONE", "RW"};
    int i = pick_region(0, 1), k = (int)rn(3);
    begin("mprotect");
    if (i < 0)
        return end();
    struct region *r = &regs[i];
    size_t p0, n;
    if (!mapped_run(r, &p0, &n))
        return end();
    size_t x = rn(2) ? 0 : rn(n), y = rn(2) ? n : x + 1 + rn(n - x);
    add(" r%d +%zup %zup %s", r->id, p0 + x, y - x, names[k]);
    errno = 0;
    int rc = mprotect(r->base + (p0 + x) * PG, (y - x) * PG, prots[k]);
    add(" -> %d errno=%d", rc, rc ? errno : 0);
    if (!rc) {
        set_pages(r, p0 + x, y - x, states[k]);
        r->simple = 0;
        r->gen = ++gens;
    }
    end();
}

static void op_memlock(void) {
    static const size_t mib[] = {1, 2, 3, 4, 8};
    size_t l = mib[rn(5)] * MiB;
    begin("memlock");
    add(" %zuMiB", l / MiB);
    struct rlimit rl = {l, l};
    errno = 0;
    int rc = setrlimit(RLIMIT_MEMLOCK, &rl);
    add(" -> %d errno=%d", rc, rc ? errno : 0);
    end();
}

static const char *access_name(int a) {
    static char b[4][32];
    static int k;
    char *s = b[k++ % 4];
    snprintf(s, 32, "%s%s%s%s%s", a & 1 ? "LW|" : "", a & 2 ? "RW|" : "", a & 4 ? "RR|" : "",
             a & 8 ? "RA|" : "", a ? "" : "0");
    if (a)
        s[strlen(s) - 1] = 0;
    return s;
}

static int free_handle_slot(void) {
    for (int i = 0; i < NH; i++)
        if (!hs[i].live)
            return i;
    return -1;
}

static void remember(int reg, size_t off, size_t len, int access, int via, uint64_t iova_page) {
    struct hist *h = &hist[rn(NHIST)];
    *h = (struct hist){1, reg, regs[reg].id, access, via, off, len, iova_page};
}

static void op_dereg_one(int k);

static void op_reg(void) {
    int i = -1, access, via;
    size_t off = 0, len = 0;
    uint64_t iova_page = (1 + rn(1 << 20)) << 12;
    struct hist *h = &hist[rn(NHIST)];
    int again = rn(5) < 2 && h->used && regs[h->reg].live && regs[h->reg].id == h->rid &&
                (state(&regs[h->reg], h->off, h->len) & P_MAP);
    if (again) {
        i = h->reg;
        off = h->off;
        len = h->len;
        access = h->access;
        via = h->via;
        iova_page = h->iova_page;
    } else {
        i = pick_region(1, 1);
        access = (int)rn(16);
        via = (int)rn(3);
        if (i >= 0 && !pick_range(i, &off, &len))
            i = -1;
    }
    int k = free_handle_slot();
    if (k < 0) /* full: release one instead */
        return op_dereg_one((int)rn(NH));
    begin("reg");
    if (i < 0)
        return end();
    struct region *r = &regs[i];
    char *addr = r->base + off;
    uint64_t iova = via ? iova_page | ((uintptr_t)addr & (PG - 1)) : (uintptr_t)addr;
    static const char *vias[] = {"reg_mr", "reg_mr_iova", "reg_mr_iova2"};
    add(" h%d r%d+%#zx/%#zx %s %s%s", next_handle, r->id, off, len, access_name(access), vias[via],
        again ? " again" : "");
    errno = 4242;
    struct ibv_mr *mr =
        via == 0   ? ibv_reg_mr(rig.pd, addr, len, access)
        : via == 1 ? ibv_reg_mr_iova(rig.pd, addr, len, iova, access)
                   : ibv_reg_mr_iova2(rig.pd, addr, len, iova, (unsigned)access);
    if (!mr) {
        add(" -> NULL errno=%d", errno);
        return end();
    }
    n_regs++;
    remember(i, off, len, access, via, iova_page);
    add(" -> ok%s%s", mr->addr == addr ? "" : " addr=WRONG",
        mr->length == len ? "" : " length=WRONG");
    hs[k] = (struct handle){1, next_handle++, i, access, via, 1, r->gen, off, len, iova, mr};
    prove(&rig, mr, r, off, len, access, iova, (unsigned)opno);
    end();
}

static void op_dereg_one(int k) {
    begin("dereg");
    int n = 0;
    for (int j = 0; j < NH; j++)
        n += hs[j].live;
    if (!n)
        return end();
    while (!hs[k % NH].live)
        k++;
    struct handle *h = &hs[k % NH];
    add(" h%d", h->id);
    uint32_t rkey = h->mr->rkey;
    errno = 4242;
    int rc = ibv_dereg_mr(h->mr);
    add(" -> %d errno=%d", rc, rc ? errno : 0);
    if (!rc && (h->access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                             IBV_ACCESS_REMOTE_ATOMIC))) {
        struct dead *d = &deads[rn(NDEAD)];
        *d = (struct dead){1, next_dead++, h->reg, h->access, regs[h->reg].gen, h->off, h->len,
                           h->iova, rkey};
    }
    h->live = 0;
    end();
}

static int pick_handle(int provable) {
    int c[NH], n = 0;
    for (int i = 0; i < NH; i++) {
        const struct handle *h = &hs[i];
        if (h->live && (!provable || (h->prove_ok && regs[h->reg].live &&
                                      regs[h->reg].gen == h->gen)))
            c[n++] = i;
    }
    return n ? c[rn((size_t)n)] : -1;
}

static void op_rereg(void) {
    int k = pick_handle(0), flags = (int)rn(8), access = (int)rn(16), i = -1;
    size_t off = 0, len = 0;
    if (rn(8) == 0)
        flags |= 8; /* not a flag libibverbs knows */
    if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
        i = pick_region(1, 1);
        if (i >= 0 && !pick_range(i, &off, &len))
            i = -1;
    }
    begin("rereg");
    if (k < 0)
        return end();
    struct handle *h = &hs[k];
    add(" h%d flags=%#x", h->id, flags);
    if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
        if (i < 0)
            return end();
        add(" r%d+%#zx/%#zx", regs[i].id, off, len);
    }
    if (flags & IBV_REREG_MR_CHANGE_ACCESS)
        add(" %s", access_name(access));
    char *addr = i >= 0 ? regs[i].base + off : NULL;
    errno = 4242;
    int rc = ibv_rereg_mr(h->mr, flags, flags & IBV_REREG_MR_CHANGE_PD ? rig.pd : NULL, addr, len,
                          access);
    add(" -> %d errno=%d", rc, rc ? errno : 0);
    if (rc) {
        h->prove_ok = 0; /* what an MR is after a failed rereg is the provider's business */
        return end();
    }
    if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
        h->reg = i;
        h->off = off;
        h->len = len;
        h->iova = (uintptr_t)addr;
        h->gen = regs[i].gen;
    }
    if (flags & IBV_REREG_MR_CHANGE_ACCESS)
        h->access = access;
    struct region *r = &regs[h->reg];
    if (!r->live || r->gen != h->gen || !h->prove_ok)
        return end();
    add("%s%s", (char *)h->mr->addr == r->base + h->off ? "" : " addr=WRONG",
        h->mr->length == h->len ? "" : " length=WRONG");
    prove(&rig, h->mr, r, h->off, h->len, h->access, h->iova, (unsigned)opno);
    end();
}

static void op_prove(void) {
    int k = pick_handle(1);
    begin("prove");
    if (k < 0)
        return end();
    struct handle *h = &hs[k];
    add(" h%d", h->id);
    prove(&rig, h->mr, &regs[h->reg], h->off, h->len, h->access, h->iova, (unsigned)opno);
    end();
}

static void op_late(void) {
    int c[NDEAD], n = 0;
    for (int i = 0; i < NDEAD; i++)
        if (deads[i].live)
            c[n++] = i;
    begin("late");
    if (!n)
        return end();
    struct dead *d = &deads[c[rn((size_t)n)]];
    struct region *r = &regs[d->reg];
    size_t cl = d->len < PG ? d->len : PG;
    int seen = r->live && r->gen == d->gen && (state(r, d->off, cl) & P_R);
    const char *how = d->access & IBV_ACCESS_REMOTE_WRITE  ? "write"
                      : d->access & IBV_ACCESS_REMOTE_READ ? "read"
                                                           : "atomic";
    add(" d%d %s", d->id, how);
    n_late++; /* counted when skipped too: the end line stays comparable */
    if (late_skip) {
        add(" skipped");
        return end();
    }
    static unsigned char before[PG];
    unsigned char *p = (unsigned char *)r->base + d->off;
    if (seen)
        memcpy(before, p, cl);
    fill(rig.scratch, cl, (unsigned)opno);
    int rc;
    if (d->access & IBV_ACCESS_REMOTE_WRITE)
        rc = post(&rig, IBV_WR_RDMA_WRITE, rig.scratch, cl, rig.smr->lkey, d->raddr, d->rkey, 0);
    else if (d->access & IBV_ACCESS_REMOTE_READ)
        rc = post(&rig, IBV_WR_RDMA_READ, rig.scratch, cl, rig.smr->lkey, d->raddr, d->rkey, 0);
    else
        rc = post(&rig, IBV_WR_ATOMIC_FETCH_AND_ADD, rig.scratch, 8, rig.smr->lkey,
                  (d->raddr + 7) & ~7ull, d->rkey, 1);
    if (rc)
        add(" -> refused wc%d", rc >= 1000 ? rc - 1000 : -rc);
    else
        add(" -> ACCEPTED with a dead key");
    if (seen)
        add(" memory %s", memcmp(before, p, cl) ? "CHANGED" : "same");
    end();
}

static void op_fork(int underscore) {
    int i = pick_region(1, 1);
    size_t off = 0, len = 0;
    if (i >= 0 && !pick_range(i, &off, &len))
        i = -1;
    begin(underscore ? "_fork" : "fork");
    if (i >= 0 && state(&regs[i], off, len) != P_RW)
        i = -1;
    if (i >= 0)
        add(" r%d+%#zx/%#zx", regs[i].id, off, len);
    int fds[2];
    if (pipe(fds)) {
        add(" -> pipe errno=%d", errno);
        return end();
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = underscore ? _Fork() : fork();
    if (pid == 0) {
        close(fds[0]);
        linelen = 0;
        struct rig c;
        if (i < 0)
            add("no range");
        else if (rig_open(&c))
            add("cannot open the device");
        else {
            struct region *r = &regs[i];
            int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
            errno = 4242;
            struct ibv_mr *mr = ibv_reg_mr(c.pd, r->base + off, len, acc);
            if (!mr)
                add("reg NULL errno=%d", errno);
            else {
                add("reg ok");
                prove(&c, mr, r, off, len, acc, (uintptr_t)r->base + off, (unsigned)opno);
                add(" dereg %d", ibv_dereg_mr(mr));
            }
            rig_close(&c);
        }
        if (write(fds[1], line, linelen) < 0)
            _exit(3);
        _exit(0);
    }
    close(fds[1]);
    if (pid < 0) {
        close(fds[0]);
        add(" -> errno=%d", errno);
        return end();
    }
    n_children++;
    char got[512];
    size_t gl = 0;
    int st = 0, waited = 0;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            break;
        if (waited >= 60000) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            break;
        }
        usleep(2000);
        waited += 2;
    }
    ssize_t m;
    while (gl < sizeof got - 1 && (m = read(fds[0], got + gl, sizeof got - 1 - gl)) > 0)
        gl += (size_t)m;
    close(fds[0]);
    got[gl] = 0;
    /* the child's line ends up in our line buffer: begin() again after the child wrote it */
    if (waited >= 60000)
        add(" -> child HUNG (killed after 60 s): %s", got);
    else if (WIFEXITED(st))
        add(" -> child exit %d: %s", WEXITSTATUS(st), got);
    else
        add(" -> child killed by signal %d: %s", WTERMSIG(st), got);
    end();
}

/* Without CAP_IPC_LOCK the kernel charges every pinned page to RLIMIT_MEMLOCK. The preload
 * reads both when it starts, so they are set before an exec of ourselves. */
static void low_memlock(char **argv) {
    if (getenv("DIFFERENTIAL_MEMLOCK_SET"))
        return;
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    CHECK(syscall(SYS_capget, &hdr, data) == 0, "capget: %s", strerror(errno));
    if (prctl(PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0) && errno != EINVAL)
        CHECK(0, "PR_CAPBSET_DROP CAP_IPC_LOCK: %s", strerror(errno));
    data[0].effective &= ~(1u << CAP_IPC_LOCK);
    data[0].permitted &= ~(1u << CAP_IPC_LOCK);
    data[0].inheritable &= ~(1u << CAP_IPC_LOCK);
    CHECK(syscall(SYS_capset, &hdr, data) == 0, "capset: %s", strerror(errno));
    struct rlimit rl = {4 * MiB, 4 * MiB};
    CHECK(setrlimit(RLIMIT_MEMLOCK, &rl) == 0, "setrlimit: %s", strerror(errno));
    setenv("DIFFERENTIAL_MEMLOCK_SET", "1", 1);
    execv("/proc/self/exe", argv);
    CHECK(0, "exec /proc/self/exe: %s", strerror(errno));
}

static int run(uint64_t seed, int n, const char *ops, char **argv) {
    if (op_on[O_MEMLOCK])
        low_memlock(argv);
    rs = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    for (int i = 0; i < 8; i++)
        rnd();
    printf("seed %llu n %d ops %s\n", (unsigned long long)seed, n, ops ? ops : "all");
    if (rig_open(&rig)) {
        printf("cannot open the device and connect the QPs: errno=%d\n", errno);
        return 2;
    }
    int total = 0;
    for (int i = 0; i < O_N; i++)
        total += op_on[i] * op_weight[i];
    CHECK(total > 0, "no operation left in --ops");
    for (opno = 1; opno <= n; opno++) {
        int w = (int)rn((size_t)total), o = 0;
        for (; w >= op_on[o] * op_weight[o]; o++)
            w -= op_on[o] * op_weight[o];
        switch (o) {
        case O_MMAP: op_mmap(); break;
        case O_MALLOC: op_malloc(); break;
        case O_REALLOC: op_realloc(); break;
        case O_FREE: op_free(); break;
        case O_TRIM: op_trim(); break;
        case O_MUNMAP: op_munmap(); break;
        case O_MREMAP: op_mremap(); break;
        case O_MADVISE: op_madvise(); break;
        case O_MAP_FIXED: op_map_fixed(); break;
        case O_REG: op_reg(); break;
        case O_DEREG: op_dereg_one((int)rn(NH)); break;
        case O_REREG: op_rereg(); break;
        case O_PROVE: op_prove(); break;
        case O_LATE: op_late(); break;
        case O_FORK: op_fork(0); break;
        case O_UFORK: op_fork(1); break;
        case O_MPROTECT: op_mprotect(); break;
        case O_MEMLOCK: op_memlock(); break;
        }
    }
    int bad = 0;
    for (int k = 0; k < NH; k++)
        if (hs[k].live)
            bad += ibv_dereg_mr(hs[k].mr) != 0;
    for (int i = 0; i < NREG; i++)
        if (regs[i].live && regs[i].kind == K_MALLOC)
            free(regs[i].base);
    printf("cleanup: %d deregs failed\n", bad);
    int rc_mr = ibv_dereg_mr(rig.smr);
    rig.smr = NULL;
    for (int i = 0; i < 2; i++)
        ibv_destroy_qp(rig.qp[i]);
    ibv_destroy_cq(rig.cq);
    int rc_pd = ibv_dealloc_pd(rig.pd);
    int rc_ctx = ibv_close_device(rig.ctx);
    printf("close: scratch dereg %d, dealloc_pd %d, close_device %d\n", rc_mr, rc_pd, rc_ctx);
    printf("end regs=%lu proofs=%lu late=%lu children=%lu\n", n_regs, n_proofs, n_late,
           n_children);
    return 0;
}

/* ---------------------------------------------------------------- the driver */

struct config {
    const char *name, *env;
    int late_skip;
};
static const struct config configs[] = {
    {"revoke", "MRCACHE_REMOTE=revoke", 0},
    {"keep", "MRCACHE_REMOTE=keep", 1},
    {"bypass", "MRCACHE_REMOTE=bypass", 0},
    {"always", "MRCACHE_ADMIT=always", 0},
    {"tiny", "MRCACHE_ADMIT=always MRCACHE_MAX_ENTRIES=2", 0},
    {"always-keep", "MRCACHE_ADMIT=always MRCACHE_REMOTE=keep", 1},
    {"shadow0", "MRCACHE_ADMIT=always MRCACHE_SHADOW=0", 0},
    {"fork-flush", "MRCACHE_ADMIT=always MRCACHE_FORK=flush", 0},
    {"verify", "MRCACHE_ADMIT=always MRCACHE_VERIFY=pfn", 0},
    /* A planted bug: nothing tells the cache that memory went away. It must differ. */
    {"unmonitored", "MRCACHE_ADMIT=always MRCACHE_MONITOR=none", 0},
};
#define NCONF (int)(sizeof configs / sizeof configs[0])
#define DEFAULT_CONFIGS "revoke,keep,bypass,always,tiny"
#define ALL_CONFIGS "revoke,keep,bypass,always,tiny,always-keep,shadow0,fork-flush,verify"

struct log {
    char *text;
    char **lines;
    int n;
    char err[64]; /* its stderr file */
};

static void split(struct log *l) {
    l->n = 0;
    l->lines = NULL;
    int cap = 0;
    for (char *s = l->text; *s;) {
        char *e = strchr(s, '\n');
        if (e)
            *e = 0;
        if (l->n == cap)
            l->lines = realloc(l->lines, (size_t)(cap = cap ? cap * 2 : 256) * sizeof(char *));
        l->lines[l->n++] = s;
        if (!e)
            break;
        s = e + 1;
    }
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f)
        return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 128);
    size_t got = fread(b, 1, (size_t)n, f);
    b[got] = 0;
    fclose(f);
    return b;
}

extern char **environ;

/* Run `differential run ...` once, without the preload (cfg NULL) or under cfg. */
static void run_child(char **args, const struct config *cfg, int timeout_s, struct log *l) {
    char out[] = "/tmp/differential.out.XXXXXX";
    snprintf(l->err, sizeof l->err, "/tmp/differential.err.XXXXXX");
    int fo = mkstemp(out), fe = mkstemp(l->err);
    CHECK(fo >= 0 && fe >= 0, "mkstemp: %s", strerror(errno));
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        setpgid(0, 0);
        dup2(fo, 1);
        dup2(fe, 2);
        char *names[256];
        int nn = 0;
        for (char **e = environ; *e && nn < 256; e++)
            if (!strncmp(*e, "MRCACHE_", 8) || !strncmp(*e, "LD_PRELOAD=", 11) ||
                !strncmp(*e, "DIFFERENTIAL_", 13))
                names[nn++] = strndup(*e, strcspn(*e, "="));
        const char *lib = getenv("MRCACHE_PRELOAD");
        char *lib_copy = lib ? strdup(lib) : NULL;
        for (int i = 0; i < nn; i++)
            unsetenv(names[i]);
        if (cfg) {
            if (!lib_copy) {
                fprintf(stderr, "differential: MRCACHE_PRELOAD (the library) is not set\n");
                _exit(2);
            }
            setenv("LD_PRELOAD", lib_copy, 1);
            char env[256];
            snprintf(env, sizeof env, "%s", cfg->env);
            for (char *t = strtok(env, " "); t; t = strtok(NULL, " "))
                putenv(strdup(t));
        }
        execv("/proc/self/exe", args);
        _exit(127);
    }
    setpgid(pid, pid);
    int st = 0, ms = 0;
    while (waitpid(pid, &st, WNOHANG) != pid) {
        if (ms >= timeout_s * 1000) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            st = -1;
            break;
        }
        usleep(10000);
        ms += 10;
    }
    kill(-pid, SIGKILL); /* a fork child left behind */
    close(fo);
    close(fe);
    char *t = slurp(out);
    unlink(out);
    size_t n = strlen(t);
    t = realloc(t, n + 64);
    if (st == -1)
        snprintf(t + n, 64, "TIMEOUT after %d s\n", timeout_s);
    else if (WIFEXITED(st))
        snprintf(t + n, 64, "exit %d\n", WEXITSTATUS(st));
    else
        snprintf(t + n, 64, "killed by signal %d\n", WTERMSIG(st));
    l->text = t;
    split(l);
}

static int is_late(const char *s) {
    const char *sp = strchr(s, ' ');
    return sp && !strncmp(sp + 1, "late ", 5);
}

/* The first differing line (indices into a and b), or 0 when the logs are the same. */
static int differ(const struct log *a, const struct log *b, int skip_late, int *ia, int *ib) {
    int i = 0, j = 0;
    for (;;) {
        while (skip_late && i < a->n && is_late(a->lines[i]))
            i++;
        while (skip_late && j < b->n && is_late(b->lines[j]))
            j++;
        if (i == a->n || j == b->n) {
            *ia = i;
            *ib = j;
            return i != a->n || j != b->n;
        }
        if (strcmp(a->lines[i], b->lines[j])) {
            *ia = i;
            *ib = j;
            return 1;
        }
        i++;
        j++;
    }
}

static void tail(const char *path, int lines) {
    char *t = slurp(path);
    int n = 0;
    char *s = t + strlen(t);
    while (s > t && n <= lines)
        if (*--s == '\n')
            n++;
    if (*t)
        printf("  its stderr (last lines):\n    %s\n", s == t ? s : s + 1);
    free(t);
}

/* Keep a log in the current directory: differential-SEED-NAME.log. */
static void save(const char *seed, const char *name, const struct log *l) {
    char path[256];
    snprintf(path, sizeof path, "differential-%s-%s.log", seed, name);
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    for (int i = 0; i < l->n; i++)
        fprintf(f, "%s\n", l->lines[i]);
    fclose(f);
}

static int compare(int argc, char **argv, int n, const char *ops, const char *confs,
                   int timeout_s) {
    const struct config *sel[NCONF];
    int ns = 0;
    char cb[512];
    snprintf(cb, sizeof cb, "%s", !strcmp(confs, "all") ? ALL_CONFIGS : confs);
    for (char *t = strtok(cb, ","); t; t = strtok(NULL, ",")) {
        int i = 0;
        while (i < NCONF && strcmp(configs[i].name, t))
            i++;
        if (i == NCONF) {
            fprintf(stderr, "differential: --configs: unknown configuration '%s'; allowed: all", t);
            for (int j = 0; j < NCONF; j++)
                fprintf(stderr, ", %s", configs[j].name);
            fprintf(stderr, "\n");
            return 2;
        }
        sel[ns++] = &configs[i];
    }
    unsigned long seeds = 0, runs = 0, diffs = 0, regs_ = 0, proofs = 0, late = 0, children = 0;
    char nb[32];
    snprintf(nb, sizeof nb, "--n=%d", n);
    char ob[600];
    snprintf(ob, sizeof ob, "--ops=%s", ops ? ops : "all");
    for (int a = 0; a < argc; a++) {
        char *seed = argv[a];
        char *args[] = {"differential", "run", seed, nb, ob, NULL, NULL};
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        struct log plain;
        run_child(args, NULL, timeout_s, &plain);
        runs++;
        seeds++;
        unsigned long r = 0, p = 0, la = 0, c = 0;
        int ended = 0;
        for (int i = 0; i < plain.n; i++)
            if (sscanf(plain.lines[i], "end regs=%lu proofs=%lu late=%lu children=%lu", &r, &p,
                       &la, &c) == 4)
                ended = 1;
        if (!ended || strcmp(plain.lines[plain.n - 1], "exit 0")) {
            printf("seed %s: libibverbs alone did not finish: %s\n", seed,
                   plain.lines[plain.n - 1]);
            tail(plain.err, 10);
            diffs++;
            unlink(plain.err);
            continue;
        }
        unlink(plain.err);
        regs_ += r;
        proofs += p;
        late += la;
        children += c;
        int bad = 0;
        for (int k = 0; k < ns; k++) {
            struct log other;
            args[5] = sel[k]->late_skip ? "--late=skip" : NULL;
            run_child(args, sel[k], timeout_s, &other);
            runs++;
            int ia, ib;
            if (differ(&plain, &other, sel[k]->late_skip, &ia, &ib)) {
                bad++;
                diffs++;
                printf("DIFFERS: seed %s, configuration %s (%s), %s:\n", seed, sel[k]->name,
                       sel[k]->env, ops ? ob : "--ops=all");
                for (int i = ia - 3 < 1 ? 1 : ia - 3; i < ia; i++)
                    printf("  both:              %s\n", plain.lines[i]);
                printf("  libibverbs alone:  %s\n", ia < plain.n ? plain.lines[ia] : "(end)");
                printf("  %-17s  %s\n", sel[k]->name, ib < other.n ? other.lines[ib] : "(end)");
                printf("  reproduce: differential compare --configs=%s %s %s %s\n", sel[k]->name,
                       nb, ob, seed);
                save(seed, "alone", &plain);
                save(seed, sel[k]->name, &other);
                printf("  both logs: differential-%s-alone.log, differential-%s-%s.log\n", seed,
                       seed, sel[k]->name);
                tail(other.err, 8);
            }
            unlink(other.err);
            free(other.text);
            free(other.lines);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        printf("seed %s: %s in %d configuration%s (%d ops: %lu registrations, %lu RDMA proofs, "
               "%lu late ops with dead keys, %lu children) [%.1f s]\n",
               seed, bad ? "DIFFERS" : "same", ns, ns == 1 ? "" : "s", n, r, p, la, c,
               (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
        fflush(stdout);
        free(plain.text);
        free(plain.lines);
    }
    printf("differential: %lu seeds, %lu runs, %lu differing; in the logs of libibverbs alone: "
           "%lu registrations, %lu RDMA proofs, %lu late ops with dead keys, %lu children\n",
           seeds, runs, diffs, regs_, proofs, late, children);
    return diffs ? 1 : 0;
}

static int usage(void) {
    fprintf(stderr, "usage: differential run SEED [--n=N] [--ops=LIST] [--late=skip]\n"
                    "       differential compare [--n=N] [--ops=LIST] [--configs=LIST|all] "
                    "[--timeout=S] SEED...\n"
                    "       differential configs\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2)
        return usage();
    int n = 200, timeout_s = 300;
    const char *ops = NULL, *confs = DEFAULT_CONFIGS;
    char *pos[4096];
    int np = 0;
    for (int i = 2; i < argc; i++) {
        if (!strncmp(argv[i], "--n=", 4))
            n = atoi(argv[i] + 4);
        else if (!strncmp(argv[i], "--ops=", 6))
            ops = !strcmp(argv[i] + 6, "all") ? NULL : argv[i] + 6;
        else if (!strncmp(argv[i], "--configs=", 10))
            confs = argv[i] + 10;
        else if (!strncmp(argv[i], "--timeout=", 10))
            timeout_s = atoi(argv[i] + 10);
        else if (!strcmp(argv[i], "--late=skip"))
            late_skip = 1;
        else if (argv[i][0] == '-' || np == 4096)
            return usage();
        else
            pos[np++] = argv[i];
    }
    if (n < 1 || timeout_s < 1) {
        fprintf(stderr, "differential: --n and --timeout take a positive integer\n");
        return 2;
    }
    for (int i = 0; i < np; i++) {
        char *e;
        strtoull(pos[i], &e, 10);
        if (!*pos[i] || *e) {
            fprintf(stderr, "differential: seed '%s' is not a non-negative integer\n", pos[i]);
            return 2;
        }
    }
    if (parse_ops(ops))
        return 2;
    if (!strcmp(argv[1], "configs")) {
        for (int i = 0; i < NCONF; i++)
            printf("%-12s %s%s\n", configs[i].name, configs[i].env,
                   configs[i].late_skip ? " (late ops with dead keys not compared: the rkey "
                                          "stays valid by design)" : "");
        printf("default: %s; all: %s\n", DEFAULT_CONFIGS, ALL_CONFIGS);
        return 0;
    }
    if (!strcmp(argv[1], "run") && np == 1) {
        setvbuf(stdout, NULL, _IOFBF, 1 << 16);
        return run(strtoull(pos[0], NULL, 10), n, ops, argv);
    }
    if (!strcmp(argv[1], "compare") && np >= 1)
        return compare(np, pos, n, ops, confs, timeout_s);
    return usage();
}
