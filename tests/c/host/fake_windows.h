/* A fake device's memory windows for the host tests of MRCACHE_REMOTE=revoke (revoke_after_unbind_timeout.c,
 * rereg_revocable.c): alloc/dealloc/bind ops and a CQ whose completions come in posting order, a
 * bind or unbind taking effect when its completion is reaped; the test can hold back the
 * next unbind's completion (hold_next_unbind) or delay it by a number of polls
 * (delay_next_unbind). Included once per program: its state is the program's own. */
#include <infiniband/verbs.h>
#include <string.h>

#define WINDOWS 16
struct fmw {
    struct ibv_mw mw; /* first: the pointer handed out */
    int alive, bound;
};
static struct fmw windows[WINDOWS];
static uint32_t next_key = 0x1000;

struct pending {
    uint64_t wr_id;
    struct fmw *w;
    int bind;    /* 1 bind, 0 unbind */
    int held;    /* not delivered until released */
    long delay;  /* polls before it can be delivered */
};
static struct pending queue[64];
static int q_head, q_tail;
static int hold_next_unbind, delay_next_unbind;
static long polls;

static struct ibv_mw *fake_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type) {
    for (int i = 0; i < WINDOWS; i++)
        if (!windows[i].alive && !windows[i].mw.context) {
            struct fmw *w = &windows[i];
            w->alive = 1, w->bound = 0;
            w->mw.context = pd->context, w->mw.pd = pd, w->mw.type = type;
            w->mw.rkey = next_key, next_key += 0x100;
            return &w->mw;
        }
    return NULL;
}
static int fake_dealloc_mw(struct ibv_mw *mw) {
    struct fmw *w = (struct fmw *)mw;
    w->alive = 0, w->bound = 0; /* a synchronous command: the key is dead on return */
    return 0;
}
static int fake_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *b) {
    (void)qp;
    struct pending *p = &queue[q_tail++ % 64];
    memset(p, 0, sizeof(*p));
    p->wr_id = b->wr_id, p->w = (struct fmw *)mw, p->bind = b->bind_info.length != 0;
    if (!p->bind && hold_next_unbind) hold_next_unbind = 0, p->held = 1;
    if (!p->bind && delay_next_unbind) p->delay = delay_next_unbind, delay_next_unbind = 0;
    if (p->bind) mw->rkey = (mw->rkey & ~0xffu) | ((mw->rkey + 1) & 0xff);
    return 0;
}
static int fake_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
    (void)cq;
    polls++;
    if (n < 1 || q_head == q_tail) return 0;
    struct pending *p = &queue[q_head % 64];
    if (p->held) return 0;
    if (p->delay > 0) {
        p->delay--;
        return 0;
    }
    q_head++;
    if (p->w->alive) p->w->bound = p->bind; /* the device acts when it completes */
    memset(wc, 0, sizeof(*wc));
    wc->wr_id = p->wr_id, wc->status = IBV_WC_SUCCESS, wc->opcode = IBV_WC_BIND_MW;
    return 1;
}

static struct fmw *window_of(uint32_t rkey) {
    for (int i = 0; i < WINDOWS; i++)
        if (windows[i].mw.context && windows[i].mw.rkey == rkey) return &windows[i];
    return NULL;
}
