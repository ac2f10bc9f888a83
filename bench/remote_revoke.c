/* The candidates for revoking a cached REMOTE_WRITE registration at ibv_dereg_mr, measured
 * on one device (issue 10). Run WITHOUT the preload: it calls libibverbs directly.
 *
 *   remote_revoke MODE [SECONDS]
 *   MODE  plain   ibv_reg_mr + ibv_dereg_mr of a 64 KiB buffer, REMOTE_WRITE (the baseline;
 *                 run it again under the preload for each MRCACHE_REMOTE mode)
 *         local   the same loop with LOCAL_WRITE only
 *         rereg   one MR; per iteration ibv_rereg_mr(CHANGE_ACCESS) to remote ("hit") and
 *                 back to local-only ("release")
 *         mw2     one MR (local + MW_BIND) and a type-2 window; per iteration a signaled
 *                 IBV_WR_BIND_MW (rkey bumped with ibv_inc_rkey) and a signaled
 *                 IBV_WR_LOCAL_INV, both on a QP of our own connected to itself
 *         mw1     the same with a type-1 window: ibv_bind_mw (new rkey) and a zero-length
 *                 bind to revoke, on the same QP
 *         mw1split  mw1, timing the post and the wait for its completion apart
 *         check   key semantics of each mechanism, proven with RDMA WRITEs from a second
 *                 QP pair on the same PD (the "peer"): does the key reach memory while
 *                 granted, is it refused after revoke, is a key from before a re-grant
 *                 refused after it, and does rereg change the rkey?
 * Prints BENCH mode=... ns_per_pair=... lines and CHECK ... lines. */
#include "../tests/c/guest/lib/loopback.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#define LEN (64u << 10)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The cache's own QP: RC, connected to itself, its own CQ. */
struct own {
    struct ibv_cq *cq;
    struct ibv_qp *qp;
};

static int own_open(struct own *o, struct ibv_context *ctx, struct ibv_pd *pd) {
    struct ibv_port_attr port;
    union ibv_gid gid;
    if (ibv_query_port(ctx, 1, &port) || ibv_query_gid(ctx, 1, 1, &gid))
        return EIO;
    o->cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
    struct ibv_qp_init_attr qa = {.send_cq = o->cq, .recv_cq = o->cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 4, .max_recv_wr = 1,
                                          .max_send_sge = 1, .max_recv_sge = 1}};
    o->qp = o->cq ? ibv_create_qp(pd, &qa) : NULL;
    if (!o->qp)
        return ENOMEM;
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
                            .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
    if (ibv_modify_qp(o->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                     IBV_QP_ACCESS_FLAGS))
        return EIO;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = port.active_mtu;
    a.dest_qp_num = o->qp->qp_num;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid;
    a.ah_attr.grh.sgid_index = 1;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(o->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                     IBV_QP_MIN_RNR_TIMER))
        return EIO;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    return ibv_modify_qp(o->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                        IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                        IBV_QP_MAX_QP_RD_ATOMIC)
               ? EIO
               : 0;
}

/* Empty polls before each completion, and (mode mw1split) the time in the post and in the
 * wait: where a window round's time goes on a device. */
static long empty_polls, waits;
static double post_s, wait_s;
static int split;

static int own_wait(struct own *o) {
    struct ibv_wc wc;
    waits++;
    for (long spins = 0;; spins++, empty_polls++) {
        int n = ibv_poll_cq(o->cq, 1, &wc);
        if (n < 0)
            return EIO;
        if (n == 1)
            return wc.status == IBV_WC_SUCCESS ? 0 : 1000 + (int)wc.status;
        if (spins > 200000000)
            return ETIMEDOUT;
    }
}

static int mw2_bind(struct own *o, struct ibv_mw *mw, struct ibv_mr *mr, void *addr,
                    size_t len) {
    uint32_t rkey = ibv_inc_rkey(mw->rkey);
    struct ibv_send_wr wr = {.wr_id = 1, .opcode = IBV_WR_BIND_MW,
                             .send_flags = IBV_SEND_SIGNALED};
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = rkey;
    wr.bind_mw.bind_info.mr = mr;
    wr.bind_mw.bind_info.addr = (uintptr_t)addr;
    wr.bind_mw.bind_info.length = len;
    wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
    struct ibv_send_wr *bad;
    int rc = ibv_post_send(o->qp, &wr, &bad);
    if (rc)
        return rc;
    rc = own_wait(o);
    if (rc == 0)
        mw->rkey = rkey;
    return rc;
}

static int mw2_invalidate(struct own *o, struct ibv_mw *mw) {
    struct ibv_send_wr wr = {.wr_id = 2, .opcode = IBV_WR_LOCAL_INV,
                             .send_flags = IBV_SEND_SIGNALED};
    wr.invalidate_rkey = mw->rkey;
    struct ibv_send_wr *bad;
    int rc = ibv_post_send(o->qp, &wr, &bad);
    return rc ? rc : own_wait(o);
}

static int mw1_bind(struct own *o, struct ibv_mw *mw, struct ibv_mr *mr, void *addr,
                    size_t len) {
    struct ibv_mw_bind b = {.wr_id = 3, .send_flags = IBV_SEND_SIGNALED};
    b.bind_info.mr = mr;
    b.bind_info.addr = (uintptr_t)addr;
    b.bind_info.length = len;
    b.bind_info.mw_access_flags = len ? IBV_ACCESS_REMOTE_WRITE : 0;
    double t0 = split ? now() : 0;
    int rc = ibv_bind_mw(o->qp, mw, &b);
    double t1 = split ? now() : 0;
    rc = rc ? rc : own_wait(o);
    if (split) {
        post_s += t1 - t0;
        wait_s += now() - t1;
    }
    return rc;
}

/* A write from a fresh peer pair (the peer's QP pair is in error after a refusal). */
static int peer_write(struct loopback *parent, void *dst, uint32_t rkey, unsigned seed) {
    struct loopback p;
    CHECK(lb_open_shared(&p, parent) == 0, "peer pair");
    memset(dst, 0, 4096);
    lb_fill(p.stage, 4096, seed);
    int rc = lb_write(&p, p.stage, 4096, p.stage_mr->lkey, (uintptr_t)dst, rkey);
    int landed = lb_check(dst, 4096, seed) < 0;
    lb_close(&p);
    if (rc == 0 && !landed)
        return -2;
    if (rc != 0 && landed)
        return -3;
    return rc; /* 0: landed; >0: refused (data untouched) */
}

static const char *verdict(int rc) {
    return rc == 0 ? "LANDS" : rc > 0 ? "refused" : "INCONSISTENT";
}

static void check(struct loopback *lb, char *buf) {
    int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    /* rereg */
    struct ibv_mr *mr = ibv_reg_mr(lb->pd, buf, LEN, rw);
    CHECK(mr, "reg");
    uint32_t k0 = mr->rkey;
    printf("CHECK rereg: rkey at registration %#x: write %s\n", k0, verdict(peer_write(lb, buf, k0, 1)));
    int rc = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE);
    printf("CHECK rereg: to local-only: rc %d errno %d (%s); rkey now %#x\n", rc, errno, strerror(errno), mr->rkey);
    if (rc == 0) {
        printf("CHECK rereg: old rkey %#x after revoke: write %s\n", k0, verdict(peer_write(lb, buf, k0, 2)));
        rc = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, rw);
        printf("CHECK rereg: back to remote: rc %d; rkey now %#x (%s)\n", rc, mr->rkey,
               mr->rkey == k0 ? "SAME key: a peer holding the old key regains access" : "new key");
        printf("CHECK rereg: old rkey %#x after re-grant: write %s\n", k0, verdict(peer_write(lb, buf, k0, 3)));
    }
    ibv_dereg_mr(mr);

    struct ibv_device_attr da;
    ibv_query_device(lb->ctx, &da);
    printf("CHECK device: max_mw %d, MEM_WINDOW %d, TYPE_2A %d, TYPE_2B %d\n", da.max_mw,
           !!(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW),
           !!(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2A),
           !!(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B));
    for (int type = 2; type >= 1; type--) {
        struct own o;
        CHECK(own_open(&o, lb->ctx, lb->pd) == 0, "own qp");
        mr = ibv_reg_mr(lb->pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
        CHECK(mr, "reg mw_bind");
        struct ibv_mw *mw = ibv_alloc_mw(lb->pd, type == 2 ? IBV_MW_TYPE_2 : IBV_MW_TYPE_1);
        if (!mw) {
            printf("CHECK mw%d: ibv_alloc_mw failed: %s\n", type, strerror(errno));
            ibv_dereg_mr(mr);
            continue;
        }
        printf("CHECK mw%d: MR rkey %#x (local+MW_BIND): write %s\n", type, mr->rkey,
               verdict(peer_write(lb, buf, mr->rkey, 9)));
        rc = type == 2 ? mw2_bind(&o, mw, mr, buf, LEN) : mw1_bind(&o, mw, mr, buf, LEN);
        uint32_t k1 = mw->rkey;
        printf("CHECK mw%d: bind rc %d, window rkey %#x: peer write %s\n", type, rc, k1,
               rc ? "-" : verdict(peer_write(lb, buf, k1, 4)));
        if (rc == 0) {
            /* Through our own QP (the window's QP for type 2): write to itself. */
            struct loopback self = *lb;
            self.qp[0] = o.qp;
            self.cq = o.cq;
            memset(buf, 0, 4096);
            lb_fill(lb->stage, 4096, 11);
            int src = lb_write(&self, lb->stage, 4096, lb->stage_mr->lkey, (uintptr_t)buf, k1);
            printf("CHECK mw%d: write through the binding QP itself: %s\n", type,
                   src == 0 && lb_check(buf, 4096, 11) < 0 ? "LANDS" : "refused");
            if (src) { /* our QP is in error now: a new one */
                ibv_destroy_qp(o.qp);
                ibv_destroy_cq(o.cq);
                CHECK(own_open(&o, lb->ctx, lb->pd) == 0, "own qp");
            }
        }
        rc = type == 2 ? mw2_invalidate(&o, mw) : mw1_bind(&o, mw, mr, buf, 0);
        printf("CHECK mw%d: revoke rc %d; old window rkey %#x: peer write %s\n", type, rc, k1,
               verdict(peer_write(lb, buf, k1, 5)));
        rc = type == 2 ? mw2_bind(&o, mw, mr, buf, LEN) : mw1_bind(&o, mw, mr, buf, LEN);
        printf("CHECK mw%d: re-bind rc %d, new rkey %#x (%s); key from before %#x: peer write %s\n",
               type, rc, mw->rkey, mw->rkey == k1 ? "SAME" : "fresh", k1,
               verdict(peer_write(lb, buf, k1, 6)));
        if (type == 2)
            mw2_invalidate(&o, mw);
        else
            mw1_bind(&o, mw, mr, buf, 0);
        ibv_dealloc_mw(mw);
        ibv_dereg_mr(mr);
        ibv_destroy_qp(o.qp);
        ibv_destroy_cq(o.cq);
    }
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "plain";
    double seconds = argc > 2 ? atof(argv[2]) : 2.0;
    if (!strcmp(mode, "mw1split")) {
        split = 1;
        mode = "mw1";
    }
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "open");
    char *buf = aligned_alloc(4096, LEN);
    memset(buf, 1, LEN);
    if (!strcmp(mode, "check")) {
        check(&lb, buf);
        lb_close(&lb);
        return 0;
    }
    int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    struct own o = {0};
    struct ibv_mr *mr = NULL;
    struct ibv_mw *mw = NULL;
    if (!strcmp(mode, "rereg")) {
        mr = ibv_reg_mr(lb.pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE);
    } else if (!strcmp(mode, "mw1") || !strcmp(mode, "mw2")) {
        CHECK(own_open(&o, lb.ctx, lb.pd) == 0, "own qp");
        mr = ibv_reg_mr(lb.pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
        mw = ibv_alloc_mw(lb.pd, mode[2] == '2' ? IBV_MW_TYPE_2 : IBV_MW_TYPE_1);
        CHECK(mw, "alloc_mw: %s", strerror(errno));
    } else {
        CHECK(!strcmp(mode, "plain") || !strcmp(mode, "local"), "unknown mode %s", mode);
    }
    long iters = 0;
    double t0 = now(), t;
    do {
        for (int k = 0; k < 16; k++, iters++) {
            int rc = 0;
            if (!strcmp(mode, "plain") || !strcmp(mode, "local")) {
                struct ibv_mr *m = ibv_reg_mr(lb.pd, buf, LEN, mode[0] == 'p' ? rw : IBV_ACCESS_LOCAL_WRITE);
                rc = !m || ibv_dereg_mr(m);
            } else if (!strcmp(mode, "rereg")) {
                rc = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, rw) ||
                     ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
                                  IBV_ACCESS_LOCAL_WRITE);
            } else if (!strcmp(mode, "mw2")) {
                rc = mw2_bind(&o, mw, mr, buf, LEN) || mw2_invalidate(&o, mw);
            } else {
                rc = mw1_bind(&o, mw, mr, buf, LEN) || mw1_bind(&o, mw, mr, buf, 0);
            }
            CHECK(rc == 0, "%s failed at iteration %ld (errno %s)", mode, iters, strerror(errno));
        }
        t = now();
    } while (t - t0 < seconds);
    double ns = (t - t0) * 1e9 / iters;
    printf("BENCH mode=%s size=%u iters=%ld ns_per_pair=%.0f pairs_per_s=%.0f\n", mode, LEN, iters,
           ns, 1e9 / ns);
    if (waits)
        printf("BENCH waits=%ld empty_polls_per_wait=%.1f", waits, (double)empty_polls / waits);
    if (split)
        printf(" post_ns=%.0f wait_ns=%.0f", post_s * 1e9 / waits, wait_s * 1e9 / waits);
    if (waits)
        printf("\n");
    if (mw)
        ibv_dealloc_mw(mw);
    if (mr)
        ibv_dereg_mr(mr);
    if (o.qp)
        ibv_destroy_qp(o.qp);
    if (o.cq)
        ibv_destroy_cq(o.cq);
    lb_close(&lb);
    return 0;
}
