/* Under the preload, a second ibv_dereg_mr of a cached MR returns EINVAL instead of
 * freeing memory twice, for the provider's own pointer and for a shadow; NULL gives EINVAL. */
#include "lib/loopback.h"

#include <errno.h>

int main(void) {
    CHECK(mrcache_loaded(), "this test needs libmrcache.so preloaded");
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
    char *buf = malloc(1 << 20);
    struct ibv_mr *a = ibv_reg_mr(lb.pd, buf, 1 << 20, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *b = ibv_reg_mr(lb.pd, buf, 1 << 20, IBV_ACCESS_LOCAL_WRITE);
    CHECK(a && b && a != b, "two registrations");
    CHECK(ibv_dereg_mr(b) == 0, "first dereg of the shadow");
    CHECK(ibv_dereg_mr(b) == EINVAL, "second dereg of the shadow must give EINVAL");
    CHECK(ibv_dereg_mr(a) == 0, "first dereg");
    CHECK(ibv_dereg_mr(a) == EINVAL, "second dereg must give EINVAL");
    CHECK(ibv_dereg_mr(NULL) == EINVAL, "ibv_dereg_mr(NULL) must give EINVAL");
    /* The cache is still sound: the registration is hit again and works. */
    struct ibv_mr *c = ibv_reg_mr(lb.pd, buf, 1 << 20, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    CHECK(c && lb_prove_write(&lb, c, buf, 1 << 20, 4) == 0, "registration after the double dereg");
    CHECK(ibv_dereg_mr(c) == 0, "dereg");
    lb_close(&lb);
    printf("double_dereg: ok\n");
    return 0;
}
