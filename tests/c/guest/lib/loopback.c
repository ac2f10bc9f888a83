#include "loopback.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define GID_INDEX 1 /* ::ffff:<ipv4>, RoCE v2; index 0 is the link-local fe80:: GID */

static int to_init(struct ibv_qp *qp) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
                            .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                               IBV_ACCESS_REMOTE_ATOMIC};
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                     IBV_QP_ACCESS_FLAGS);
}

static int to_rtr_rts(struct ibv_qp *qp, uint32_t dest_qpn, const union ibv_gid *gid,
                      enum ibv_mtu mtu) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR, .path_mtu = mtu, .dest_qp_num = dest_qpn,
                            .rq_psn = 0, .max_dest_rd_atomic = 1, .min_rnr_timer = 12};
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = *gid;
    a.ah_attr.grh.sgid_index = GID_INDEX;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                       IBV_QP_MIN_RNR_TIMER);
    if (rc)
        return rc;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = 1;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static int connect_pair(struct loopback *lb, const union ibv_gid *gid, enum ibv_mtu mtu);

int mrcache_loaded(void) { return dlsym(RTLD_DEFAULT, "mrcache_version") != NULL; }

void *lb_libibverbs_symbol(const char *name, const char *version) {
    void *libc = dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY);
    void *verbs = dlopen("libibverbs.so.1", RTLD_NOLOAD | RTLD_NOW);
    void *found = libc ? dlsym(libc, "dlvsym") : NULL;
    CHECK(found && verbs, "lb_libibverbs_symbol: libc's dlvsym or libibverbs not found");
    void *(*libc_dlvsym)(void *, const char *, const char *);
    memcpy(&libc_dlvsym, &found, sizeof found);
    return libc_dlvsym(verbs, name, version);
}

int lb_open(struct loopback *lb, const char *device) {
    memset(lb, 0, sizeof *lb);
    if (!device)
        device = getenv("MRCACHE_TEST_DEVICE");
    if (!device)
        device = "rxe0";
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list) {
        fprintf(stderr, "lb_open: ibv_get_device_list: %s\n", strerror(errno));
        return errno ? errno : ENODEV;
    }
    for (int i = 0; i < n && !lb->ctx; i++)
        if (!strcmp(ibv_get_device_name(list[i]), device))
            lb->ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!lb->ctx) {
        fprintf(stderr, "lb_open: device %s not found or cannot be opened\n", device);
        return ENODEV;
    }
    struct ibv_port_attr port;
    union ibv_gid gid;
    if (ibv_query_port(lb->ctx, 1, &port) || ibv_query_gid(lb->ctx, 1, GID_INDEX, &gid)) {
        fprintf(stderr, "lb_open: cannot query port 1 / gid %d\n", GID_INDEX);
        return EIO;
    }
    lb->pd = ibv_alloc_pd(lb->ctx);
    if (!lb->pd) {
        fprintf(stderr, "lb_open: cannot allocate a PD\n");
        return ENOMEM;
    }
    return connect_pair(lb, &gid, port.active_mtu);
}

int lb_open_shared(struct loopback *lb, const struct loopback *parent) {
    memset(lb, 0, sizeof *lb);
    lb->ctx = parent->ctx;
    lb->pd = parent->pd;
    lb->shared = 1;
    struct ibv_port_attr port;
    union ibv_gid gid;
    if (ibv_query_port(lb->ctx, 1, &port) || ibv_query_gid(lb->ctx, 1, GID_INDEX, &gid))
        return EIO;
    return connect_pair(lb, &gid, port.active_mtu);
}

static int make_qps(struct loopback *lb, const union ibv_gid *gidp, enum ibv_mtu mtu) {
    union ibv_gid gid = *gidp;
    for (int i = 0; i < 2; i++) {
        struct ibv_qp_init_attr qa = {.send_cq = lb->cq, .recv_cq = lb->cq, .qp_type = IBV_QPT_RC,
                                      .cap = {.max_send_wr = 16, .max_recv_wr = 16,
                                              .max_send_sge = 1, .max_recv_sge = 1}};
        lb->qp[i] = ibv_create_qp(lb->pd, &qa);
        if (!lb->qp[i] || to_init(lb->qp[i])) {
            fprintf(stderr, "lb_open: cannot create QP %d: %s\n", i, strerror(errno));
            return EIO;
        }
    }
    for (int i = 0; i < 2; i++)
        if (to_rtr_rts(lb->qp[i], lb->qp[1 - i]->qp_num, &gid, mtu)) {
            fprintf(stderr, "lb_open: cannot connect QP %d: %s\n", i, strerror(errno));
            return EIO;
        }
    return 0;
}

static int connect_pair(struct loopback *lb, const union ibv_gid *gid, enum ibv_mtu mtu) {
    lb->cq = ibv_create_cq(lb->ctx, 64, NULL, NULL, 0);
    if (!lb->cq) {
        fprintf(stderr, "lb_open: cannot create a CQ\n");
        return ENOMEM;
    }
    int rc = make_qps(lb, gid, mtu);
    if (rc)
        return rc;
    lb->stage = malloc(LB_STAGE_BYTES);
    lb->stage_mr = lb->stage ? ibv_reg_mr(lb->pd, lb->stage, LB_STAGE_BYTES, IBV_ACCESS_LOCAL_WRITE)
                             : NULL;
    if (!lb->stage_mr) {
        fprintf(stderr, "lb_open: cannot register the staging buffer: %s\n", strerror(errno));
        return ENOMEM;
    }
    return 0;
}

void lb_close(struct loopback *lb) {
    if (lb->stage_mr && ibv_dereg_mr(lb->stage_mr))
        fprintf(stderr, "lb_close: ibv_dereg_mr(stage) failed: %s\n", strerror(errno));
    free(lb->stage);
    for (int i = 0; i < 2; i++)
        if (lb->qp[i])
            ibv_destroy_qp(lb->qp[i]);
    if (lb->cq)
        ibv_destroy_cq(lb->cq);
    /* A PD that cannot be freed after the app released everything means a registration
     * leaked (the cache must give back its idle ones first): a test failure. */
    int rc = !lb->shared && lb->pd ? ibv_dealloc_pd(lb->pd) : 0;
    CHECK(rc == 0, "lb_close: ibv_dealloc_pd failed: %s (a registration leaked?)", strerror(rc));
    rc = !lb->shared && lb->ctx ? ibv_close_device(lb->ctx) : 0;
    CHECK(rc == 0, "lb_close: ibv_close_device failed: %d", rc);
    memset(lb, 0, sizeof *lb);
}

static int post_and_wait(struct loopback *lb, enum ibv_wr_opcode op, void *local, size_t len,
                         uint32_t lkey, uint64_t raddr, uint32_t rkey) {
    struct ibv_sge sge = {.addr = (uintptr_t)local, .length = (uint32_t)len, .lkey = lkey};
    struct ibv_send_wr wr = {.wr_id = 42, .sg_list = &sge, .num_sge = 1, .opcode = op,
                             .send_flags = IBV_SEND_SIGNALED};
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    struct ibv_send_wr *bad;
    int rc = ibv_post_send(lb->qp[0], &wr, &bad);
    if (rc)
        return rc;
    struct ibv_wc wc;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int n = ibv_poll_cq(lb->cq, 1, &wc);
        if (n < 0)
            return EIO;
        if (n == 1)
            return wc.status == IBV_WC_SUCCESS ? 0 : 1000 + (int)wc.status;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 30) {
            fprintf(stderr, "post_and_wait: no completion in 30 s\n");
            return ETIMEDOUT;
        }
    }
}

int lb_await_error_state(struct ibv_qp *const qp[2], enum ibv_wc_status status) {
    int nak = status == IBV_WC_REM_INV_REQ_ERR || status == IBV_WC_REM_ACCESS_ERR ||
              status == IBV_WC_REM_OP_ERR;
    for (int i = 0; i < (nak ? 2 : 1); i++) {
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            struct ibv_qp_attr a;
            struct ibv_qp_init_attr ia;
            if (ibv_query_qp(qp[i], &a, IBV_QP_STATE, &ia) || a.qp_state == IBV_QPS_ERR)
                break;
            clock_gettime(CLOCK_MONOTONIC, &t);
            if (t.tv_sec - t0.tv_sec > 5) {
                fprintf(stderr, "lb_await_error_state: QP %d not in the error state 5 s after a "
                                "failed completion (status %d)\n", i, (int)status);
                return -1;
            }
            struct timespec nap = {0, 50000};
            nanosleep(&nap, NULL);
        }
    }
    return 0;
}

int lb_reconnect(struct loopback *lb) {
    struct ibv_port_attr port;
    union ibv_gid gid;
    if (ibv_query_port(lb->ctx, 1, &port) || ibv_query_gid(lb->ctx, 1, GID_INDEX, &gid)) {
        fprintf(stderr, "lb_reconnect: cannot query port 1 / gid %d\n", GID_INDEX);
        return EIO;
    }
    for (int i = 0; i < 2; i++) {
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_RESET};
        int rc = ibv_modify_qp(lb->qp[i], &a, IBV_QP_STATE);
        if (rc) {
            fprintf(stderr, "lb_reconnect: QP %d to RESET: %s\n", i, strerror(rc));
            return rc;
        }
    }
    struct ibv_wc wc[16];
    while (ibv_poll_cq(lb->cq, 16, wc) > 0) {
    }
    for (int i = 0; i < 2; i++) {
        int rc = to_init(lb->qp[i]);
        if (!rc)
            rc = to_rtr_rts(lb->qp[i], lb->qp[1 - i]->qp_num, &gid, port.active_mtu);
        if (rc) {
            struct ibv_qp_attr a;
            struct ibv_qp_init_attr ia;
            int st = ibv_query_qp(lb->qp[i], &a, IBV_QP_STATE, &ia) ? -1 : (int)a.qp_state;
            fprintf(stderr, "lb_reconnect: QP %d from RESET to RTS: %s (now in state %d)\n", i,
                    strerror(rc), st);
            return rc;
        }
    }
    return 0;
}

int lb_renew(struct loopback *lb) {
    struct ibv_port_attr port;
    union ibv_gid gid;
    if (ibv_query_port(lb->ctx, 1, &port) || ibv_query_gid(lb->ctx, 1, GID_INDEX, &gid)) {
        fprintf(stderr, "lb_renew: cannot query port 1 / gid %d\n", GID_INDEX);
        return EIO;
    }
    for (int i = 0; i < 2; i++) {
        if (lb->qp[i] && ibv_destroy_qp(lb->qp[i]))
            fprintf(stderr, "lb_renew: ibv_destroy_qp: %s\n", strerror(errno));
        lb->qp[i] = NULL;
    }
    struct ibv_wc wc[16];
    while (ibv_poll_cq(lb->cq, 16, wc) > 0) {
    }
    return make_qps(lb, &gid, port.active_mtu);
}

int lb_write(struct loopback *lb, const void *src, size_t len, uint32_t lkey, uint64_t raddr,
             uint32_t rkey) {
    return post_and_wait(lb, IBV_WR_RDMA_WRITE, (void *)src, len, lkey, raddr, rkey);
}

int lb_read(struct loopback *lb, void *dst, size_t len, uint32_t lkey, uint64_t raddr,
            uint32_t rkey) {
    return post_and_wait(lb, IBV_WR_RDMA_READ, dst, len, lkey, raddr, rkey);
}

static inline unsigned char pattern(size_t i, unsigned seed) {
    uint64_t x = (i >> 3) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed * 0xBF58476D1CE4E5B9ull);
    x ^= x >> 29;
    return (unsigned char)(x >> ((i & 7) * 8));
}

void lb_fill(void *buf, size_t len, unsigned seed) {
    unsigned char *p = buf;
    for (size_t i = 0; i < len; i++)
        p[i] = pattern(i, seed);
}

long lb_check(const void *buf, size_t len, unsigned seed) {
    const unsigned char *p = buf;
    for (size_t i = 0; i < len; i++)
        if (p[i] != pattern(i, seed))
            return (long)i;
    return -1;
}

/* LB_PROVE=page-heads: one write of at most 256 bytes at the start of each page that begins
 * inside [dst, dst+len), each checked where it must land. rxe's on-demand copy in Debian's
 * 7.3.4 drops the offset within a page (a WRITE to an ON_DEMAND MR at buf+100 lands at buf+0,
 * a READ from buf+200 returns buf+0): a write that starts a page, in one packet, is placed
 * right, and still tells old pages from new ones. */
static int prove_page_heads(struct loopback *lb, struct ibv_mr *mr, void *dst, size_t len,
                            unsigned seed) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), start = (uintptr_t)dst;
    uintptr_t end = start + len, first = (start + page - 1) & ~(page - 1);
    if (first >= end) {
        fprintf(stderr, "lb_prove_write: LB_PROVE=page-heads: no page starts in %p len %zu\n",
                dst, len);
        return -1;
    }
    /* The source starts a page too: the stage's registration may be on demand as well. */
    unsigned char *src = lb->stage + (page - (uintptr_t)lb->stage % page) % page;
    memset(dst, 0, len);
    for (uintptr_t p = first; p < end; p += page) {
        size_t n = end - p < 256 ? end - p : 256;
        unsigned s = seed + (unsigned)((p - first) / page);
        lb_fill(src, n, s);
        int rc = lb_write(lb, src, n, lb->stage_mr->lkey, p, mr->rkey);
        if (rc) {
            fprintf(stderr, "lb_prove_write: RDMA WRITE to %#lx len %zu (rkey %#x) failed: %d\n",
                    (unsigned long)p, n, mr->rkey, rc);
            return -1;
        }
        long bad = lb_check((void *)p, n, s);
        if (bad >= 0) {
            fprintf(stderr, "lb_prove_write: data did not land at %#lx: first mismatch at offset "
                            "%ld (stale registration?)\n", (unsigned long)p, bad);
            return -1;
        }
    }
    return 0;
}

int lb_prove_write(struct loopback *lb, struct ibv_mr *mr, void *dst, size_t len, unsigned seed) {
    const char *how = getenv("LB_PROVE");
    if (how && !strcmp(how, "page-heads"))
        return prove_page_heads(lb, mr, dst, len, seed);
    unsigned char *d = dst;
    memset(dst, 0, len);
    for (size_t off = 0; off < len; off += LB_STAGE_BYTES) {
        size_t n = len - off < LB_STAGE_BYTES ? len - off : LB_STAGE_BYTES;
        lb_fill(lb->stage, n, seed + (unsigned)(off / LB_STAGE_BYTES));
        int rc = lb_write(lb, lb->stage, n, lb->stage_mr->lkey, (uintptr_t)(d + off), mr->rkey);
        if (rc) {
            fprintf(stderr, "lb_prove_write: RDMA WRITE to %p len %zu (rkey %#x) failed: %d\n",
                    d + off, n, mr->rkey, rc);
            return -1;
        }
        long bad = lb_check(d + off, n, seed + (unsigned)(off / LB_STAGE_BYTES));
        if (bad >= 0) {
            fprintf(stderr, "lb_prove_write: data did not land at %p: first mismatch at offset "
                            "%ld (stale registration?)\n", dst, (long)off + bad);
            return -1;
        }
    }
    return 0;
}
