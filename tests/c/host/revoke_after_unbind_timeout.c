/* MRCACHE_REMOTE=revoke after one window unbind timed out: the next revoke on that PD must
 * not return before its own window's key is dead. A fake provider (ibv_context ops) models
 * the device: a bind or unbind takes effect when its completion is reaped, completions come
 * in posting order, and the test holds one back. Behind libmrcache.so and window_shim.so.
 *   1. register A and B with remote write (one window each, bound);
 *   2. ibv_dereg_mr(A): its unbind's completion is held (a stalled device) past
 *      MRCACHE_TEST_COMPLETION_LIMIT_MS;
 *   3. the held completion is then delivered late (it is first in the CQ);
 *   4. ibv_dereg_mr(B): its own unbind completes only after 2000 polls; when the call
 *      returns, B's key must reach nothing (its window unbound, or deallocated).
 * exit 0: B's key dead; 1: B's key still live after ibv_dereg_mr (printed); 3: set-up. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "fake_windows.h"

static struct ibv_mr *fake_reg(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
    (void)pd, (void)iova, (void)access;
    struct ibv_mr *mr = calloc(1, sizeof(struct ibv_mr) + 64);
    mr->addr = addr, mr->length = len, mr->lkey = 7, mr->rkey = 7;
    return mr;
}
static int fake_dereg(struct ibv_mr *mr) {
    free(mr);
    return 0;
}
int main(void) {
    static struct ibv_context ctx;
    static struct ibv_pd pd;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    ctx.ops.alloc_mw = fake_alloc_mw;
    ctx.ops.dealloc_mw = fake_dealloc_mw;
    ctx.ops.bind_mw = fake_bind_mw;
    ctx.ops.poll_cq = fake_poll_cq;
    pd.context = &ctx;
    size_t len = 16 * 4096;
    char *buf = mmap(NULL, 2 * len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(buf, 1, 2 * len);
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    struct ibv_mr *a = ibv_reg_mr(&pd, buf, len, access);
    struct ibv_mr *b = ibv_reg_mr(&pd, buf + len, len, access);
    if (!a || !b) {
        fprintf(stderr, "revoke_after_unbind_timeout: registration failed\n");
        return 3;
    }
    struct fmw *wa = window_of(a->rkey), *wb = window_of(b->rkey);
    if (!wa || !wb || wa == wb || !wa->bound || !wb->bound) {
        fprintf(stderr, "revoke_after_unbind_timeout: not one bound window per handle (revoke mode off?)\n");
        return 3;
    }
    uint32_t key_b = b->rkey;
    hold_next_unbind = 1;
    int rc = ibv_dereg_mr(a);
    printf("ibv_dereg_mr(A) after a stalled unbind: %d; A's key %s\n", rc,
           wa->alive && wa->bound ? "LIVE" : "dead");
    /* The device comes back: the stalled completion is delivered, late. */
    queue[q_head % 64].held = 0;
    delay_next_unbind = 2000;
    long before = polls;
    rc = ibv_dereg_mr(b);
    int live = wb->alive && wb->bound && wb->mw.rkey == key_b;
    printf("ibv_dereg_mr(B): %d after %ld polls; B's key %#x %s\n", rc, polls - before, key_b,
           live ? "STILL LIVE (returned on the stale completion)" : "dead");
    if (wa->alive && wa->bound) return 1;
    return live ? 1 : 0;
}
