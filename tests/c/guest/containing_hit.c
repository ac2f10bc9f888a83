/* A local-only registration of part of a registered buffer: under the preload it is served
 * by the containing registration (same lkey) with its own addr/length, and it works as the
 * source of an RDMA WRITE. */
#include "lib/loopback.h"

#include <string.h>

int main(void) {
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
    size_t len = 1 << 20;
    char *big = malloc(len);
    char *dst = malloc(64 << 10);
    struct ibv_mr *dmr = ibv_reg_mr(lb.pd, dst, 64 << 10, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    struct ibv_mr *bmr = ibv_reg_mr(lb.pd, big, len, IBV_ACCESS_LOCAL_WRITE);
    CHECK(dmr && bmr, "registration failed");
    char *part = big + 300000;
    size_t plen = 64 << 10;
    struct ibv_mr *pmr = ibv_reg_mr(lb.pd, part, plen, IBV_ACCESS_LOCAL_WRITE);
    CHECK(pmr, "sub-range registration failed");
    CHECK(pmr->addr == part && pmr->length == plen, "sub-range MR has addr %p length %zu",
          pmr->addr, pmr->length);
    if (mrcache_loaded())
        CHECK(pmr->lkey == bmr->lkey && pmr != bmr, "not served by the containing registration");
    lb_fill(part, plen, 77);
    memset(dst, 0, plen);
    CHECK(lb_write(&lb, part, plen, pmr->lkey, (uintptr_t)dst, dmr->rkey) == 0, "RDMA WRITE failed");
    CHECK(lb_check(dst, plen, 77) < 0, "data from the sub-range did not arrive");
    CHECK(ibv_dereg_mr(pmr) == 0 && ibv_dereg_mr(bmr) == 0 && ibv_dereg_mr(dmr) == 0, "dereg");
    lb_close(&lb);
    printf("containing_hit: ok (lkey %s)\n", mrcache_loaded() ? "shared" : "own");
    return 0;
}
