/* A fake device's memory windows whose binds cost `bind_ns` (busy-waited: `spin`), for the
 * host tests of cost-aware admission (admit_cost.c, nested_lane.c): alloc/dealloc/bind ops
 * and a CQ whose completions come in posting order. The includer defines `bind_ns`
 * before including it. Included once per program: its state is the program's own. */
#include <infiniband/verbs.h>
#include <string.h>
#include <time.h>

static void spin(long ns) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    do clock_gettime(CLOCK_MONOTONIC, &b);
    while ((b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec) < ns);
}

#define WINDOWS 64
struct fmw {
    struct ibv_mw mw;
    int alive, bound;
};
static struct fmw windows[WINDOWS];
static uint32_t next_key = 0x1000;
static struct ibv_wc done[256];
static int d_head, d_tail;

static struct ibv_mw *fake_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type) {
    for (int i = 0; i < WINDOWS; i++)
        if (!windows[i].alive) {
            struct fmw *w = &windows[i];
            w->alive = 1, w->bound = 0;
            w->mw.context = pd->context, w->mw.pd = pd, w->mw.type = type;
            w->mw.rkey = next_key, next_key += 0x100;
            return &w->mw;
        }
    return NULL;
}
static int fake_dealloc_mw(struct ibv_mw *mw) {
    ((struct fmw *)mw)->alive = 0;
    return 0;
}
static int fake_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *b) {
    (void)qp;
    spin(bind_ns);
    struct fmw *w = (struct fmw *)mw;
    w->bound = b->bind_info.length != 0;
    if (w->bound) mw->rkey = (mw->rkey & ~0xffu) | ((mw->rkey + 1) & 0xff);
    struct ibv_wc *wc = &done[d_tail++ % 256];
    memset(wc, 0, sizeof(*wc));
    wc->wr_id = b->wr_id, wc->status = IBV_WC_SUCCESS, wc->opcode = IBV_WC_BIND_MW;
    return 0;
}
static int fake_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
    (void)cq;
    if (n < 1 || d_head == d_tail) return 0;
    *wc = done[d_head++ % 256];
    return 1;
}
