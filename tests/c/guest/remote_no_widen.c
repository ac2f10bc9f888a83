/* A request with remote access must not be served by a larger registration: its rkey must
 * not let a peer write outside the range the app asked for. */
#include "lib/loopback.h"

int main(void) {
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
    size_t len = 1 << 20;
    char *big = malloc(len);
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    struct ibv_mr *bmr = ibv_reg_mr(lb.pd, big, len, access);
    CHECK(bmr, "registration failed");
    char *part = big + 4096;
    size_t plen = 8192;
    struct ibv_mr *pmr = ibv_reg_mr(lb.pd, part, plen, access);
    CHECK(pmr, "sub-range registration failed");
    CHECK(pmr->rkey != bmr->rkey, "the sub-range got the containing registration's rkey");
    CHECK(lb_prove_write(&lb, pmr, part, plen, 5) == 0, "write inside the range failed");
    /* A peer using the sub-range's rkey outside it must be refused by the HCA. */
    int rc = lb_write(&lb, lb.stage, 4096, lb.stage_mr->lkey, (uintptr_t)(big + 64 * 1024), pmr->rkey);
    CHECK(rc != 0, "a write outside the registered range succeeded: the rkey reaches too far");
    printf("remote_no_widen: write outside the range refused (status %d)\n", rc);
    /* The QP is now in error; deregistration still works. */
    CHECK(ibv_dereg_mr(pmr) == 0 && ibv_dereg_mr(bmr) == 0, "dereg");
    lb_close(&lb);
    return 0;
}
