/* The helper itself: a registered buffer receives an RDMA WRITE through the loopback QPs,
 * and a buffer that was NOT written stays untouched (the check can fail). */
#include "lib/loopback.h"

#include <string.h>

int main(void) {
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
    size_t len = 1 << 20;
    char *dst = malloc(len);
    struct ibv_mr *mr = ibv_reg_mr(lb.pd, dst, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                                   IBV_ACCESS_REMOTE_READ);
    CHECK(mr, "ibv_reg_mr failed");
    CHECK(lb_prove_write(&lb, mr, dst, len, 7) == 0, "RDMA WRITE did not land");
    /* Negative control: the pattern check must notice a buffer that was not written. */
    memset(dst, 0, len);
    CHECK(lb_check(dst, len, 7) == 0, "lb_check accepted a zeroed buffer");
    /* An RDMA READ brings back what is there. */
    lb_fill(dst, 4096, 9);
    memset(lb.stage, 0, 4096);
    CHECK(lb_read(&lb, lb.stage, 4096, lb.stage_mr->lkey, (uintptr_t)dst, mr->rkey) == 0, "read");
    CHECK(lb_check(lb.stage, 4096, 9) < 0, "RDMA READ returned wrong data");
    CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr failed");
    free(dst);
    lb_close(&lb);
    printf("loopback_write: ok\n");
    return 0;
}
