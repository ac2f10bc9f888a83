/* ibv_rereg_mr of a handle of a revocable registration (MRCACHE_REMOTE=revoke: its rkey a
 * memory window's) on a provider that has a rereg op. A fake provider (the
 * ibv_context ops of tests/c/host/revoke_after_unbind_timeout.c, with reg/dereg/rereg ops that know their own
 * MRs), behind libmrcache.so and window_shim.so.
 *   sole    the app's only handle: passed to the provider on the cached MR (not the copy),
 *           with the app's rights; the window revoked; the handle shows the MR's new keys and
 *           range; another remote registration meanwhile gets a handle of its own; its
 *           dereg deregisters that MR; the old range is registered afresh after.
 *   shared  a second live handle on the registration: IBV_REREG_MR_ERR_CMD, EOPNOTSUPP,
 *           the provider not asked.
 *   refused the provider refuses the rereg (EINVAL): its answer, and nothing changed: the
 *           same keys, the window still bound, the handle still the cache's (its dereg
 *           revokes the window, deregisters nothing; the range hits again after).
 *   noop    the provider has no rereg op at all: IBV_REREG_MR_ERR_CMD, EOPNOTSUPP, the
 *           window intact.
 *   own     (MRCACHE_REMOTE_SUPERSET=1) an idle entry registered with wider rights serves
 *           the handle: its rereg asks the provider for the handle's own rights.
 *   recycle 200 cycles of register, sole rereg, dereg: the handles' memory is reused (at
 *           most 2 distinct handles), nothing left registered or bound.
 *   shadow  a local-only registration's second handle (a shadow), the first released: the
 *           only handle left, over the entry's range, goes to the provider.
 * Prints one line per step; exit 0 when every step is as described, 1 otherwise, 3 set-up. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <errno.h>

#include "fake_windows.h"

/* The provider's own MRs, so a call on anything else (a copy) is seen. */
#define MRS 16
static struct ibv_mr *mrs[MRS];
static int mr_access[MRS];
static int reregs, rereg_flags, rereg_access, foreign_calls, deregs;
static uint32_t next_mr_key = 0x50;

static int own(struct ibv_mr *mr) {
    for (int i = 0; i < MRS; i++)
        if (mrs[i] == mr) return i;
    return -1;
}
static struct ibv_mr *fake_reg(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
    (void)pd, (void)iova;
    for (int i = 0; i < MRS; i++)
        if (!mrs[i]) {
            struct ibv_mr *mr = calloc(1, sizeof(struct ibv_mr) + 64);
            mr->addr = addr, mr->length = len, mr->lkey = mr->rkey = next_mr_key++, mr->handle = 100 + i;
            mrs[i] = mr, mr_access[i] = access;
            return mr;
        }
    return NULL;
}
static int fake_dereg(struct ibv_mr *mr) {
    int i = own(mr);
    if (i < 0) return foreign_calls++, EINVAL;
    deregs++;
    mrs[i] = NULL;
    free(mr);
    return 0;
}
/* Re-registers in place: new keys, the new range or rights. */
static int fail_rereg;
static int fake_rereg(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t len, int access) {
    (void)pd;
    int i = own(mr);
    if (i < 0) return foreign_calls++, EINVAL;
    reregs++, rereg_flags = flags, rereg_access = access;
    if (fail_rereg) return errno = fail_rereg, fail_rereg;
    if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) mr->addr = addr, mr->length = len;
    if (flags & IBV_REREG_MR_CHANGE_ACCESS) mr_access[i] = access;
    mr->lkey = mr->rkey = next_mr_key++;
    return 0;
}
static int live_windows(void) {
    int n = 0;
    for (int i = 0; i < WINDOWS; i++) n += windows[i].alive && windows[i].bound;
    return n;
}

static int live_mrs(void) {
    int n = 0;
    for (int k = 0; k < MRS; k++) n += mrs[k] != NULL;
    return n;
}

int main(int argc, char **argv) {
    static struct ibv_context ctx;
    static struct ibv_pd pd;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    ctx.ops._compat_rereg_mr = (void *(*)(void))fake_rereg;
    ctx.ops.alloc_mw = fake_alloc_mw;
    ctx.ops.dealloc_mw = fake_dealloc_mw;
    ctx.ops.bind_mw = fake_bind_mw;
    ctx.ops.poll_cq = fake_poll_cq;
    ctx.cmd_fd = -1;
    pd.context = &ctx;
    const char *s = argc > 1 ? argv[1] : "sole";
    size_t len = 16 * 4096;
    char *buf = mmap(NULL, 3 * len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *fresh = buf + len;
    memset(buf, 1, 3 * len);
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    int LW = IBV_ACCESS_LOCAL_WRITE, RR = IBV_ACCESS_REMOTE_READ;
    if (!strcmp(s, "own")) {
        struct ibv_mr *w = ibv_reg_mr(&pd, buf, len, access | RR);
        ibv_dereg_mr(w);
        int before = live_mrs();
        struct ibv_mr *b = ibv_reg_mr(&pd, buf, len, LW | RR);
        if (!b || live_mrs() != before || !window_of(b->rkey)) {
            fprintf(stderr, "rereg_revocable: the idle wider entry did not serve (MRCACHE_REMOTE_SUPERSET=1?)\n");
            return 3;
        }
        errno = 4242;
        int rc = ibv_rereg_mr(b, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, fresh, len, 0);
        printf("own: rereg rc %d errno %d; provider asked flags %#x access %#x (the handle registered %#x, the entry %#x)\n",
               rc, errno, rereg_flags, rereg_access, LW | RR, access | RR);
        int ok = rc == 0 && reregs == 1 && rereg_access == (LW | RR) &&
                 rereg_flags == (IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS);
        ok &= ibv_dereg_mr(b) == 0;
        printf("own: %s\n", ok ? "ok" : "WRONG");
        return ok ? 0 : 1;
    }
    if (!strcmp(s, "shadow")) {
        struct ibv_mr *p = ibv_reg_mr(&pd, buf, len, LW);
        struct ibv_mr *b = ibv_reg_mr(&pd, buf, len, LW);
        if (!p || !b || own(b) >= 0) {
            fprintf(stderr, "rereg_revocable: the second handle is not a shadow\n");
            return 3;
        }
        ibv_dereg_mr(p);
        errno = 4242;
        int rc = ibv_rereg_mr(b, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, LW | RR);
        int e = errno;
        int i = -1;
        for (int k = 0; k < MRS; k++)
            if (mrs[k]) i = k;
        printf("shadow: rereg of the only handle left rc %d errno %d; provider reregs %d (access %#x), calls on a copy %d; lkey %s the MR's\n",
               rc, e, reregs, rereg_access, foreign_calls, i >= 0 && b->lkey == mrs[i]->lkey ? "is" : "is not");
        int ok = rc == 0 && reregs == 1 && rereg_access == (LW | RR) && foreign_calls == 0 && i >= 0 &&
                 b->lkey == mrs[i]->lkey && b->rkey == mrs[i]->rkey;
        int d0 = deregs;
        rc = ibv_dereg_mr(b);
        printf("shadow: dereg rc %d, provider deregs %d, live MRs %d\n", rc, deregs - d0, live_mrs());
        ok &= rc == 0 && deregs - d0 == 1 && live_mrs() == 0 && foreign_calls == 0;
        printf("shadow: %s\n", ok ? "ok" : "WRONG");
        return ok ? 0 : 1;
    }
    if (!strcmp(s, "recycle")) {
        struct ibv_mr *seen[200] = {0};
        int distinct = 0, bad = 0;
        for (int n = 0; n < 200; n++) {
            struct ibv_mr *m = ibv_reg_mr(&pd, buf, len, access);
            if (!m) { bad++; break; }
            int k = 0;
            while (k < distinct && seen[k] != m) k++;
            if (k == distinct) seen[distinct++] = m;
            bad += ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, LW | RR) != 0;
            bad += ibv_dereg_mr(m) != 0;
        }
        printf("recycle: 200 cycles, %d distinct handles, %d failed calls, %d provider MR(s) live, %d window(s) bound, calls on a copy %d\n",
               distinct, bad, live_mrs(), live_windows(), foreign_calls);
        int ok = !bad && distinct <= 2 && live_mrs() == 0 && live_windows() == 0 && foreign_calls == 0;
        printf("recycle: %s\n", ok ? "ok" : "WRONG");
        return ok ? 0 : 1;
    }
    if (!strcmp(s, "noop")) ctx.ops._compat_rereg_mr = NULL;
    struct ibv_mr *a = ibv_reg_mr(&pd, buf, len, access);
    if (!a || own(a) >= 0 || !window_of(a->rkey)) {
        fprintf(stderr, "rereg_revocable: not a window's handle (revoke mode off?)\n");
        return 3;
    }
    int ok = 1;
    if (!strcmp(s, "sole")) {
        uint32_t old_rkey = a->rkey;
        errno = 4242;
        int rc = ibv_rereg_mr(a, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, fresh, len, 0);
        int e = errno;
        int i = -1;
        for (int k = 0; k < MRS; k++)
            if (mrs[k]) i = k;
        printf("sole: rereg rc %d errno %d; provider reregs %d (flags %#x, access %#x), calls on a copy %d\n",
               rc, e, reregs, rereg_flags, rereg_access, foreign_calls);
        ok &= rc == 0 && reregs == 1 && foreign_calls == 0 && rereg_access == access &&
              rereg_flags == (IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS);
        struct fmw *w = window_of(old_rkey);
        printf("sole: old window key %s; handle addr %s, lkey %s the MR's, rkey %s the MR's, MR rights %#x\n",
               w && w->alive && w->bound ? "LIVE" : "dead", a->addr == fresh ? "moved" : "not moved",
               i >= 0 && a->lkey == mrs[i]->lkey ? "is" : "is not",
               i >= 0 && a->rkey == mrs[i]->rkey ? "is" : "is not", i >= 0 ? mr_access[i] : -1);
        ok &= !(w && w->alive && w->bound) && a->addr == fresh && i >= 0 && a->lkey == mrs[i]->lkey &&
              a->rkey == mrs[i]->rkey && mr_access[i] == access;
        /* Another window's handle while the app holds this one: never the same object. */
        struct ibv_mr *c = ibv_reg_mr(&pd, buf + 2 * len, len, access);
        printf("sole: another remote registration meanwhile: %s\n",
               !c ? "FAILED" : c == a ? "GOT THE APP'S HANDLE" : "its own handle");
        ok &= c && c != a && a->addr == fresh;
        if (c) ibv_dereg_mr(c);
        int before = deregs;
        rc = ibv_dereg_mr(a);
        printf("sole: dereg rc %d, provider deregs %d, calls on a copy %d\n", rc, deregs - before, foreign_calls);
        ok &= rc == 0 && deregs - before == 1 && foreign_calls == 0;
        struct ibv_mr *b = ibv_reg_mr(&pd, buf, len, access);
        int live = 0;
        for (int k = 0; k < MRS; k++) live += mrs[k] != NULL;
        printf("sole: the old range again: %s, %d provider MR(s) live, %d window(s) bound\n",
               b ? "registered" : "FAILED", live, live_windows());
        /* b's and the cache's idle one of the third range; b's window only. */
        ok &= b && live == 2 && live_windows() == 1;
        if (b) ibv_dereg_mr(b);
    } else if (!strcmp(s, "refused") || !strcmp(s, "noop")) {
        int want = s[0] == 'r' ? EINVAL : EOPNOTSUPP;
        fail_rereg = EINVAL;
        uint32_t rkey = a->rkey, lkey = a->lkey;
        errno = 4242;
        int rc = ibv_rereg_mr(a, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
        int e = errno;
        struct fmw *w = window_of(rkey);
        printf("%s: rereg rc %d errno %d (provider reregs %d); rkey %s, lkey %s, old key %s\n", s, rc, e, reregs,
               a->rkey == rkey ? "unchanged" : "CHANGED", a->lkey == lkey ? "unchanged" : "CHANGED",
               w && w->alive && w->bound ? "still bound" : "REVOKED");
        ok &= rc == IBV_REREG_MR_ERR_CMD && e == want && a->rkey == rkey && a->lkey == lkey && w && w->alive && w->bound;
        int d0 = deregs;
        rc = ibv_dereg_mr(a);
        printf("%s: dereg rc %d, provider deregs %d, windows bound %d\n", s, rc, deregs - d0, live_windows());
        ok &= rc == 0 && deregs == d0 && live_windows() == 0;
        int m0 = live_mrs();
        struct ibv_mr *b = ibv_reg_mr(&pd, buf, len, access);
        printf("%s: the range again: %s\n", s, b && live_mrs() == m0 ? "a hit" : "NOT a hit");
        ok &= b && live_mrs() == m0 && foreign_calls == 0;
        if (b) ibv_dereg_mr(b);
    } else {
        struct ibv_mr *b = ibv_reg_mr(&pd, buf, len, access);
        errno = 4242;
        int rc = ibv_rereg_mr(b, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE);
        int e = errno;
        printf("shared: rereg rc %d errno %d; provider reregs %d, calls on a copy %d\n", rc, e, reregs, foreign_calls);
        ok &= rc == IBV_REREG_MR_ERR_CMD && e == EOPNOTSUPP && reregs == 0 && foreign_calls == 0;
        ok &= ibv_dereg_mr(b) == 0 && ibv_dereg_mr(a) == 0;
    }
    printf("%s: %s\n", s, ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
}
