/* REMOTE_READ-only and REMOTE_ATOMIC registrations behave as without the cache. */
#include "lib/loopback.h"
#include <string.h>
#include <errno.h>
#define LEN (16u << 10)
int main(void) {
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "open");
    unsigned char *b = malloc(LEN);
    lb_fill(b, LEN, 4);
    for (int round = 0; round < 2; round++) {
        struct ibv_mr *mr = ibv_reg_mr(lb.pd, b, LEN, IBV_ACCESS_REMOTE_READ);
        CHECK(mr, "reg REMOTE_READ only (errno %d)", errno);
        memset(lb.stage, 0, LEN);
        int rc = lb_read(&lb, lb.stage, LEN, lb.stage_mr->lkey, (uintptr_t)b, mr->rkey);
        CHECK(rc == 0 && lb_check(lb.stage, LEN, 4) < 0, "read round %d: %d", round, rc);
        CHECK(ibv_dereg_mr(mr) == 0, "dereg");
        struct ibv_mr *at = ibv_reg_mr(lb.pd, b, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
        CHECK(at, "reg REMOTE_ATOMIC (errno %d)", errno);
        CHECK(ibv_dereg_mr(at) == 0, "dereg");
    }
    printf("read_only: ok\n");
    return 0;
}
