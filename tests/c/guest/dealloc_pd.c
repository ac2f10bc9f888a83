/* ibv_dealloc_pd and ibv_close_device succeed after the app deregistered its MRs, even
 * though the cache still holds them; and a PD with an MR the app still holds stays busy,
 * as without the cache. */
#include "lib/loopback.h"

#include <errno.h>
#include <string.h>

int main(void) {
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
    struct ibv_pd *pd = ibv_alloc_pd(lb.ctx);
    CHECK(pd, "ibv_alloc_pd");
    char *buf = malloc(4 << 20);
    struct ibv_mr *mrs[8];
    for (int i = 0; i < 8; i++)
        CHECK((mrs[i] = ibv_reg_mr(pd, buf + i * (512 << 10), 256 << 10, IBV_ACCESS_LOCAL_WRITE)), "reg %d", i);
    for (int i = 0; i < 7; i++)
        CHECK(ibv_dereg_mr(mrs[i]) == 0, "dereg %d", i);
    int rc = ibv_dealloc_pd(pd);
    CHECK(rc == EBUSY, "ibv_dealloc_pd with an MR still registered returned %d, want EBUSY", rc);
    CHECK(ibv_dereg_mr(mrs[7]) == 0, "dereg 7");
    rc = ibv_dealloc_pd(pd);
    CHECK(rc == 0, "ibv_dealloc_pd after deregistering everything: %d (%s)", rc, strerror(rc));

    /* The same through ibv_close_device: a second context with its own PD and MRs. */
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_context *ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    CHECK(ctx, "second context");
    struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
    struct ibv_mr *m = ibv_reg_mr(pd2, buf, 1 << 20, IBV_ACCESS_LOCAL_WRITE);
    CHECK(m && ibv_dereg_mr(m) == 0, "reg/dereg on the second context");
    CHECK(ibv_dealloc_pd(pd2) == 0, "dealloc pd2");
    CHECK(ibv_close_device(ctx) == 0, "close the second context");
    lb_close(&lb);
    printf("dealloc_pd: ok\n");
    return 0;
}
