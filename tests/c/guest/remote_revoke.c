/* After ibv_dereg_mr returns, the keys of that registration must not reach memory
 *, exactly as without the cache.
 *
 *   remote_revoke SCENARIO EXPECT
 *   SCENARIO  freed  register a 16 KiB heap buffer REMOTE_WRITE, prove a write lands,
 *                    ibv_dereg_mr, free, malloc the same size again (the allocator hands
 *                    back the same memory), fill it, then RDMA WRITE with the old rkey
 *             hit    register, prove, ibv_dereg_mr, register the same buffer again (a
 *                    cache hit under the preload), prove the new key, then RDMA WRITE with
 *                    the key from before the hit
 *   EXPECT    refused  the late write must fail and leave the memory untouched (libibverbs
 *                      alone; the preload with MRCACHE_REMOTE=revoke)
 *             lands    the late write succeeds (MRCACHE_REMOTE=keep: the documented risk)
 * Every late write comes from a fresh QP pair (a refused one leaves its pair in error). */
#include "lib/loopback.h"

#include <string.h>

#define LEN (16u << 10)

/* RDMA WRITE of a pattern to dst with rkey from a fresh pair; returns the status (0 =
 * completed) and whether dst now holds the pattern. */
static int late_write(struct loopback *lb, void *dst, uint32_t rkey, unsigned seed, int *landed) {
    struct loopback peer;
    CHECK(lb_open_shared(&peer, lb) == 0, "cannot open a peer pair");
    lb_fill(peer.stage, LEN, seed);
    int rc = lb_write(&peer, peer.stage, LEN, peer.stage_mr->lkey, (uintptr_t)dst, rkey);
    *landed = lb_check(dst, LEN, seed) < 0;
    lb_close(&peer);
    return rc;
}

int main(int argc, char **argv) {
    CHECK(argc == 3 && (!strcmp(argv[1], "freed") || !strcmp(argv[1], "hit")) &&
              (!strcmp(argv[2], "refused") || !strcmp(argv[2], "lands")),
          "usage: remote_revoke freed|hit refused|lands");
    int freed = !strcmp(argv[1], "freed");
    int expect_refused = !strcmp(argv[2], "refused");
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

    unsigned char *buf = malloc(LEN);
    /* Keeps buf off the top of the heap, so free(buf) never trims (and unmaps) it. */
    void *guard = malloc(LEN);
    CHECK(buf && guard, "malloc");
    struct ibv_mr *mr = ibv_reg_mr(lb.pd, buf, LEN, access);
    CHECK(mr, "registration failed");
    if (!expect_refused) {
        /* Showing keep's risk needs the registration cached; one made while an unrelated
         * unmap is in flight (a library thread's) is handed out uncached: until a
         * registration hits (same key), try again. */
        int cached = 0;
        for (int i = 0; i < 20 && !cached; i++) {
            uint32_t key = mr->rkey;
            CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
            mr = ibv_reg_mr(lb.pd, buf, LEN, access);
            CHECK(mr, "registration failed");
            cached = mr->rkey == key;
        }
        CHECK(cached, "MRCACHE_REMOTE=keep: 20 registrations of one buffer, none cached");
    }
    uint32_t old_rkey = mr->rkey;
    CHECK(lb_prove_write(&lb, mr, buf, LEN, 1) == 0, "the write with the live rkey did not land");
    CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");

    unsigned char *target = buf;
    struct ibv_mr *again = NULL;
    if (freed) {
        uintptr_t was = (uintptr_t)buf;
        free(buf);
        target = malloc(LEN); /* another object now owns this memory */
        CHECK((uintptr_t)target == was, "malloc did not hand back the freed memory (%p, was "
                                        "%#lx): the scenario needs it", (void *)target,
              (unsigned long)was);
    } else {
        again = ibv_reg_mr(lb.pd, buf, LEN, access);
        CHECK(again, "second registration failed");
        CHECK(lb_prove_write(&lb, again, buf, LEN, 2) == 0, "the new key did not land");
        printf("remote_revoke: rkey before the hit %#x, after %#x\n", old_rkey, again->rkey);
    }
    memset(target, 0x5a, LEN);
    int landed = 0;
    int rc = late_write(&lb, target, old_rkey, 3, &landed);
    int untouched = 1;
    for (size_t i = 0; i < LEN; i++)
        untouched &= target[i] == 0x5a;
    printf("remote_revoke %s: RDMA WRITE with the old rkey %#x: status %d, %s\n", argv[1], old_rkey,
           rc, landed ? "all 16384 bytes overwritten" : untouched ? "memory untouched" : "memory partly changed");
    if (expect_refused) {
        CHECK(rc != 0 && untouched, "the old rkey still reaches the memory after ibv_dereg_mr");
    } else {
        CHECK(rc == 0 && landed, "MRCACHE_REMOTE=keep: the old rkey was expected to still work");
    }
    if (again)
        CHECK(ibv_dereg_mr(again) == 0, "ibv_dereg_mr");
    free(target);
    free(guard);
    lb_close(&lb);
    printf("remote_revoke %s: ok (%s)\n", argv[1], argv[2]);
    return 0;
}
