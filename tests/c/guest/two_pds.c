/* Two PDs registering the same buffer never share an MR: the second PD's registration must
 * belong to it (mr->pd), and the first PD's QP must not be able to use its rkey. */
#include "lib/loopback.h"

#include <errno.h>
#include <string.h>

int main(void) {
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
    struct ibv_pd *pd2 = ibv_alloc_pd(lb.ctx);
    CHECK(pd2, "second PD");
    size_t len = 1 << 20;
    char *buf = malloc(len);
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    struct ibv_mr *m1 = ibv_reg_mr(lb.pd, buf, len, access);
    CHECK(m1, "registration on PD 1");
    CHECK(ibv_dereg_mr(m1) == 0, "dereg"); /* idle in the cache now */
    struct ibv_mr *m2 = ibv_reg_mr(pd2, buf, len, access);
    CHECK(m2 && m2->pd == pd2, "registration on PD 2 (pd %p)", m2 ? (void *)m2->pd : NULL);
    m1 = ibv_reg_mr(lb.pd, buf, len, access);
    CHECK(m1 && m1 != m2 && m1->rkey != m2->rkey, "the two PDs share an MR");
    CHECK(lb_prove_write(&lb, m1, buf, len, 9) == 0, "PD 1's MR must work with PD 1's QP");
    int rc = lb_write(&lb, lb.stage, 4096, lb.stage_mr->lkey, (uintptr_t)buf, m2->rkey);
    CHECK(rc != 0, "PD 1's QP wrote through PD 2's rkey");
    CHECK(ibv_dereg_mr(m1) == 0 && ibv_dereg_mr(m2) == 0, "dereg");
    CHECK(ibv_dealloc_pd(pd2) == 0, "ibv_dealloc_pd of the second PD: %s", strerror(errno));
    lb_close(&lb);
    printf("two_pds: ok\n");
    return 0;
}
